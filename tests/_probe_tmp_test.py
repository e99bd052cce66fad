import sys; sys.path.insert(0, "/work/main/tests")
from test_seqio_tasks import *
def test_probe(corpus):
    t = _register("probe", corpus)
    ex = _epoch(t)
    print("n", len(ex), "untrimmed q", sum(len(e["query_ids"]) < 72 for e in ex), "untrimmed pos", sum(len(e["positive_ids"]) < 40 for e in ex))
    print(st.scan_task("probe"))
