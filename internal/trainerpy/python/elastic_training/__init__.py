"""elastic-training's Python package for trainers (docs/elastic-training-backend.md).

The rendezvous sidecar installs it into the files directory it shares with the trainer, and the webhook puts that
directory on every PyTorch trainer's PYTHONPATH: nothing to pip-install, nothing to change in the image. Standard
library and torch only; importing this package imports neither.

    elastic_training.rendezvous   the elastic-training torchrun rendezvous backend (torchrun --rdzv-backend
                                  elastic-training finds it through the torchrun.handlers entry point)
    elastic_training.checkpoint   in-memory checkpoints replicated by the sidecars (docs/checkpoints.md)
    elastic_training.progress     progress(step, total=None): a rank finished a step; the sidecars find a hung
                                  round and restart it (docs/hangs.md)
"""

from ._progress import progress  # noqa: F401  (standard library only)
