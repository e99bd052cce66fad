"""What a training workdir records of its run, and the rule that a resume continues that run or stops.

A workdir holds one run. Its `model_config.json` (the model) and `run_config.json`
(trainer, data, loss and optimizer settings) are written when the run starts and
rewritten on every start. When a start finds a run there, every setting must
equal the recorded one except those in RESUMABLE, which only say how long, how
often and on which devices to train; anything else would silently train another
model than the user asked for, so it is an error that names each difference.

Each start also keeps its operative gin config under `operative_configs/`, named
by the step it started from, so that an export of step S reads the settings that
trained step S (`native.operative_config_for_step`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

from rankgen_jax.checkpoints.run_folder import RunFolder
from rankgen_jax.data.source_configs import SOURCE_CONFIGS
from rankgen_jax.errors import RankgenError
from rankgen_jax.models.configs import ModelConfig
from rankgen_jax.train.optimizers import DECAYING_SCHEDULES

# The sections of run_config.json, by the gin-configurable class whose fields each holds.
SECTIONS = {"trainer": "TrainerConfig", "data": "DataConfig", "loss": "LossConfig", "optimizer": "OptimizerConfig"}

# Settings a resume may change: the run's length, logging, checkpointing, profiling and the device
# layout (Orbax restores into any mesh; GradCache chunks give the same gradients as one chunk), the
# input pipeline's threads, the divergence guard, rematerialisation (memory, not math), and the
# learning rate, which is how a run stopped by the divergence guard goes on. A resume names each one
# that changed.
RESUMABLE = frozenset({
    "TrainerConfig.num_steps", "TrainerConfig.max_minutes", "TrainerConfig.log_every", "TrainerConfig.eval_every",
    "TrainerConfig.eval_batches", "TrainerConfig.checkpoint_every", "TrainerConfig.keep_checkpoints",
    "TrainerConfig.async_checkpoints", "TrainerConfig.profile_start_step", "TrainerConfig.profile_num_steps",
    "TrainerConfig.distributed", "TrainerConfig.mesh_data", "TrainerConfig.mesh_model", "TrainerConfig.mesh_replica",
    "TrainerConfig.axis_rules", "TrainerConfig.num_chunks", "SeqioData.tfdata_threads",
    "OptimizerConfig.max_consecutive_nonfinite", "OptimizerConfig.learning_rate", "ModelConfig.encoder.remat",
    "TrainerConfig.encoder_overrides.remat",
})


def run_config(**sections) -> dict[str, dict[str, Any]]:
    """{section: {field: value}} of the given config dataclasses (SECTIONS' keys), in their JSON form; the data
    section flat: its source's kind under "source", beside the source's own fields."""
    return {name: _json_form(_flat_fields(config)) for name, config in sections.items()}


def _flat_fields(config) -> dict[str, Any]:
    fields = dataclasses.asdict(config)
    source = getattr(config, "source", None)
    if dataclasses.is_dataclass(source):  # DataConfig: the form every run has recorded
        fields.update(fields.pop("source"), source=source.kind)
    return fields


def _data_names(current: dict) -> dict[str, str]:
    """The config class that holds each key of a flat data section (DataConfig, or the source's own class)."""
    source = SOURCE_CONFIGS.get(current.get("source"))
    return {f.name: source.__name__ for f in dataclasses.fields(source)} if source else {}


def _json_form(value):
    """As written to and read back from JSON (tuples become lists), so recorded and current compare equal."""
    return json.loads(json.dumps(value, sort_keys=True))


def save_run_config(folder: RunFolder, record: dict) -> None:
    folder.run_config.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def load_run_config(folder: RunFolder) -> dict | None:
    """The recorded run config, or None for a workdir from before the record (or without one)."""
    path = folder.run_config
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RankgenError(f"{path}: not readable JSON ({e}); it records the run this workdir holds") from None
    if not isinstance(record, dict):
        raise RankgenError(f"{path}: expected a JSON object; it records the run this workdir holds")
    return record


def differences(recorded: dict, current: dict, prefix: str, holders: dict[str, str] | None = None) -> list[str]:
    """`Name.field recorded -> current` for each setting that differs (RESUMABLE ones included); holders names the
    class of a field held elsewhere than `prefix`."""
    found = []
    for key in sorted(set(recorded) | set(current)):
        name = f"{(holders or {}).get(key, prefix)}.{key}"
        old, new = recorded.get(key, "<absent>"), current.get(key, "<absent>")
        if isinstance(old, dict) and isinstance(new, dict):
            found += differences(old, new, name)
        elif old != new:
            found.append(f"{name} {old!r} -> {new!r}")
    return found


def _resumable(difference: str) -> bool:
    # A resume takes its weights from the workdir, so leaving out the init checkpoint it started from is no change.
    return (difference.split(" ", 1)[0] in RESUMABLE
            or (difference.startswith("TrainerConfig.init_checkpoint ") and difference.endswith(" -> ''")))


def recorded_init_checkpoint(recorded_run: dict | None) -> str:
    """The init checkpoint the recorded run started from ('' when none or unrecorded)."""
    value = ((recorded_run or {}).get("trainer") or {}).get("init_checkpoint", "")
    return value if isinstance(value, str) else ""


def check_resume(workdir: RunFolder, recorded_model: ModelConfig, intended_model: ModelConfig | None,
                 recorded_run: dict | None, current_run: dict) -> None:
    """A RankgenError naming every difference between the run a workdir holds and this start's settings that a
    resume may not make; a note names those it may (RESUMABLE).

    intended_model: the model this start would build afresh; None when that is unknown (its init
    checkpoint is gone), and then only the run settings are compared. recorded_run None: a workdir
    from before run_config.json, whose model alone can be compared.
    """
    if intended_model is None:
        print(f"note: {workdir}: the init checkpoint is gone, so the model this start would build is unknown; "
              "resuming with the recorded model", file=sys.stderr)
    found = [] if intended_model is None else differences(
        _json_form(recorded_model.to_json_dict()), _json_form(intended_model.to_json_dict()), "ModelConfig")
    for section, name in SECTIONS.items():
        if recorded_run is not None and section in recorded_run:
            recorded, current = recorded_run[section], current_run.get(section, {})
            holders = None
            if section == "data":
                # A field the source does not have is one it never read (runs of earlier versions recorded all).
                holders = _data_names(current)
                if recorded.get("source") == current.get("source"):
                    recorded = {k: v for k, v in recorded.items() if k in current}
            found += differences(recorded, current, name, holders)
    refused = [d for d in found if not _resumable(d)]
    if refused:
        raise RankgenError(
            f"{workdir} holds a run with other settings than these ({'; '.join(refused)}; recorded -> now): a resume "
            "continues the recorded run, so set them back to resume it; to train with the new settings use a new "
            f"`workdir`, or start a new run from this one's weights with `TrainerConfig.init_checkpoint`={workdir} "
            f"and a new `workdir` (settings a resume may change: {', '.join(sorted(RESUMABLE))})",
            names=("workdir", "TrainerConfig.init_checkpoint"))
    if found:
        print(f"note: resuming {workdir} with changed settings: {'; '.join(found)} (recorded -> now)", file=sys.stderr)
    moved = schedule_end_moved(recorded_run, current_run)
    if moved:
        print(f"note: {moved}", file=sys.stderr)


def schedule_end_moved(recorded_run: dict | None, current_run: dict) -> str:
    """What a resume with another num_steps does to a decaying schedule that ends at the run's last step ('' when
    nothing): the schedule is stretched, so the learning rate from the resumed step on is not the recorded run's."""
    if not recorded_run:
        return ""
    before, now = recorded_run.get("trainer", {}), current_run.get("trainer", {})
    optimizer = current_run.get("optimizer", {})
    if (optimizer.get("schedule") not in DECAYING_SCHEDULES or optimizer.get("total_steps")
            or before.get("num_steps") in (None, now.get("num_steps"))):
        return ""
    return (f"the {optimizer['schedule']} learning-rate schedule ends at the run's last step, which moves from "
            f"{before['num_steps']} to {now['num_steps']}: from the resumed step on, the learning rate follows the "
            "new schedule (set OptimizerConfig.total_steps to keep one end)")


def save_operative_config(folder: RunFolder, start_step: int, text: str) -> None:
    """The operative gin config of the start at start_step: the latest one, and the one kept for that start."""
    folder.operative_config.write_text(text, encoding="utf-8")
    if not folder.operative_configs.exists():  # a bucket has no folders to make twice
        folder.operative_configs.mkdir(parents=True)
    folder.operative_config_from(start_step).write_text(text, encoding="utf-8")
