"""What a resume says about settings it may change (train/run_record.py)."""

from rankgen_jax.models.configs import ModelConfig
from rankgen_jax.train import run_record


def _run(num_steps: int, schedule: str, total_steps: int = 0) -> dict:
    return {"trainer": {"num_steps": num_steps}, "optimizer": {"schedule": schedule, "total_steps": total_steps}}


def test_a_longer_resume_of_a_decaying_schedule_says_the_schedule_moves(capsys):
    model = ModelConfig()
    run_record.check_resume("w", model, model, _run(100, "linear"), _run(300, "linear"))
    err = capsys.readouterr().err
    assert "TrainerConfig.num_steps 100 -> 300" in err
    assert "the linear learning-rate schedule ends at the run's last step, which moves from 100 to 300" in err
    # Nothing moves for a constant schedule, a schedule with its own end, or the same length.
    for recorded, now in ((_run(100, "constant"), _run(300, "constant")),
                          (_run(100, "cosine", 500), _run(300, "cosine", 500)),
                          (_run(100, "cosine"), _run(100, "cosine"))):
        run_record.check_resume("w", model, model, recorded, now)
        assert "schedule ends" not in capsys.readouterr().err
