"""The import path SLURM jobs submitted before the layout change pickled (``launch.slurm_member``): a job still
queued or requeued across an upgrade unpickles its callable from here. Nothing new imports this module."""
from launch.slurm.member import CheckpointableMember

__all__ = ["CheckpointableMember"]
