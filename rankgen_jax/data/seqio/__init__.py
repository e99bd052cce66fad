"""RankGen data as seqio tasks: vocabularies (vocab.py), task registration (tasks.py), the trainer's source (source.py).

TensorFlow only feeds data here: importing any of these modules first keeps it off the GPUs / TPUs, so that JAX
owns all of their memory.
"""

import tensorflow as tf


def _hide_accelerators_from_tf() -> None:
    """TF only feeds data here; keep it off the GPUs/TPUs so JAX owns all their memory."""
    for device_type in ("GPU", "TPU"):
        try:
            tf.config.set_visible_devices([], device_type)
        except (RuntimeError, ValueError):  # devices already initialised, or no such device type
            pass


_hide_accelerators_from_tf()


