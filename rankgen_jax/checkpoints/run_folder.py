"""A run's folder as one object: the path of every file a training run or a checkpoint keeps there.

A checkpoint folder and a training workdir share one layout (`rankgen-jax train` writes a checkpoint
folder, plus the records of its run):

    model_config.json        ModelConfig (encoder + head)
    input_conventions.json   how the model reads text (data/conventions.py)
    provenance.json          where the model came from, when known (for model cards)
    vocab/                   the tokenizer, when known
    checkpoints/<step>/      Orbax CheckpointManager steps (items `params`, and `data` for a trainer's)
    run_config.json          a training run's trainer, data, loss and optimizer settings
    config.gin, operative_config.gin, operative_configs/from_step_<N>.gin
                             a training run's gin config, rewritten at every start, and each start's
                             operative config by the step it started from
    metrics.jsonl, tensorboard/, profile/
                             a training run's metrics, TensorBoard events and profiler traces
    best/, best.json         the parameters of the step that measured best in training's retrieval
                             evaluation (a checkpoint folder of its own), and that measure, value and step
    retrieval_sets/<name>/   the nano retrieval sets the run measures (retrieval/nano.py)

The folder may be local or a bucket URL (gs://bucket/run): paths are etils.epath's, as Orbax's
are, since pathlib would turn "gs://b" into the local folder "gs:/b".
"""

from __future__ import annotations

import dataclasses
import os

from etils import epath

from rankgen_jax.data.conventions import CONVENTIONS_FILE

MODEL_CONFIG_FILE = "model_config.json"
PROVENANCE_FILE = "provenance.json"
VOCAB_DIR = "vocab"
# A SentencePiece vocabulary keeps T5's conventional name in the vocab folder, whatever it was called.
SPIECE_FILE = "spiece.model"
STEPS_DIR = "checkpoints"
DAMAGED_SUFFIX = ".damaged"
RUN_CONFIG_FILE = "run_config.json"
GIN_CONFIG_FILE = "config.gin"
OPERATIVE_CONFIG_FILE = "operative_config.gin"
OPERATIVE_CONFIGS_DIR = "operative_configs"
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
PROFILE_DIR = "profile"
# metrics.jsonl's names of the retrieval measures taken during training: retrieval/<set>/<measure>.
RETRIEVAL_METRIC_PREFIX = "retrieval/"
BEST_DIR = "best"
BEST_RECORD_FILE = "best.json"
RETRIEVAL_SETS_DIR = "retrieval_sets"
# The held-out results an experiment job keeps in its workdir, beside its training run (experiments/job_folder.py);
# a model card reports them.
JOB_RESULTS_FILE = "results.json"


def as_path(path: str | os.PathLike) -> epath.Path:
    """A local or remote (gs://, s3://...) path as an epath.Path; never a local folder named "gs:"."""
    return epath.Path(path)


def is_remote(path: str | os.PathLike) -> bool:
    """True for a URL such as gs://bucket/run, False for a local path."""
    return "://" in os.fspath(path)


def resolve(path: str | os.PathLike) -> epath.Path:
    """A local path as the OS resolves it (symlinks first, then `..`), a URL as given.

    One spelling for every file of a folder: textual normalisation (abspath) would take `lnk/../run`
    to another folder than the OS opens when `lnk` is a symlink.
    """
    return as_path(path) if is_remote(path) else as_path(os.path.realpath(os.fspath(path)))


@dataclasses.dataclass(frozen=True)
class RunFolder:
    """One run's (or checkpoint's) folder; a path-like, so it goes wherever a folder path does."""

    root: epath.Path

    @classmethod
    def at(cls, folder: str | os.PathLike) -> RunFolder:
        """The folder at `folder` as given (a RunFolder stays itself)."""
        return folder if isinstance(folder, RunFolder) else cls(as_path(folder))

    @classmethod
    def resolved(cls, folder: str | os.PathLike) -> RunFolder:
        """The folder at `folder` as the OS opens it (`resolve`): the one spelling a run uses for its files."""
        return cls(resolve(folder.root if isinstance(folder, RunFolder) else folder))

    def __fspath__(self) -> str:
        return os.fspath(self.root)

    def __str__(self) -> str:
        return str(self.root)

    @property
    def model_config(self) -> epath.Path:
        return self.root / MODEL_CONFIG_FILE

    @property
    def input_conventions(self) -> epath.Path:
        return self.root / CONVENTIONS_FILE

    @property
    def provenance(self) -> epath.Path:
        return self.root / PROVENANCE_FILE

    @property
    def vocab(self) -> epath.Path:
        return self.root / VOCAB_DIR

    @property
    def spiece_model(self) -> epath.Path:
        """The vocab folder's SentencePiece model (SPIECE_FILE)."""
        return self.vocab / SPIECE_FILE

    @property
    def steps(self) -> epath.Path:
        """The Orbax steps' folder."""
        return self.root / STEPS_DIR

    def step(self, step: int) -> epath.Path:
        return self.steps / str(step)

    def step_item(self, step: int, item: str) -> epath.Path:
        """One item of a saved step ("params"; "data" for a trainer's), as Orbax's Composite lays it out."""
        return self.step(step) / item

    def damaged_step(self, step: int, attempt: int = 0) -> epath.Path:
        """Where a damaged step's folder is set aside (Orbax lists no such name): `<step>.damaged[.<attempt>]`."""
        return self.steps / (f"{step}{DAMAGED_SUFFIX}.{attempt}" if attempt else f"{step}{DAMAGED_SUFFIX}")

    @property
    def run_config(self) -> epath.Path:
        return self.root / RUN_CONFIG_FILE

    @property
    def gin_config(self) -> epath.Path:
        return self.root / GIN_CONFIG_FILE

    @property
    def operative_config(self) -> epath.Path:
        """The latest start's operative gin config."""
        return self.root / OPERATIVE_CONFIG_FILE

    @property
    def operative_configs(self) -> epath.Path:
        return self.root / OPERATIVE_CONFIGS_DIR

    def operative_config_from(self, start_step: int) -> epath.Path:
        """The operative config of the start that began at `start_step`."""
        return self.operative_configs / f"from_step_{start_step}.gin"

    def operative_config_starts(self) -> dict[int, epath.Path]:
        """Each recorded start's step -> its operative config."""
        starts = {}
        if self.operative_configs.is_dir():
            for path in self.operative_configs.glob("from_step_*.gin"):
                number = path.stem.removeprefix("from_step_")
                if number.isdigit():
                    starts[int(number)] = path
        return starts

    @property
    def metrics(self) -> epath.Path:
        return self.root / METRICS_FILE

    @property
    def tensorboard(self) -> epath.Path:
        return self.root / TENSORBOARD_DIR

    @property
    def profile(self) -> epath.Path:
        return self.root / PROFILE_DIR

    @property
    def best(self) -> RunFolder:
        """The best step's parameters, as a checkpoint folder (train/retrieval_eval.py's keep_best)."""
        return RunFolder(self.root / BEST_DIR)

    @property
    def best_record(self) -> epath.Path:
        return self.root / BEST_RECORD_FILE

    def retrieval_set(self, name: str) -> epath.Path:
        """A nano retrieval set the run built and measures, by its name in the metrics."""
        return self.root / RETRIEVAL_SETS_DIR / name

    def file(self, name: str) -> epath.Path:
        """Another file a job keeps in the folder (its results, plots), by name."""
        return self.root / name
