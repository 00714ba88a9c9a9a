"""The ``launcher=slurm`` settings (conf/launcher/slurm.yaml), validated before any job is submitted.

Kept apart from the launcher so that a config mistake is reported with the key and the fix without touching
the cluster, and so that the mapping to submitit's sbatch parameters is one readable function.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from launch.base import LauncherSettings
from core.gpu_time import MEMBERS_PER_GPU_CHOICES
from core.notice_window import SIGNAL_DELAY_ENV
from core.config.group_schemas import setting
from core.config.typed_nodes import typed_node

#: how members share a GPU: ``packed`` (k members in one array task holding the GPU: works on any cluster) or
#: ``shard`` (one member per task asking for its part of the GPU's shards: needs the site's gres shard set-up)
GPU_SHARING = ("packed", "shard")

#: launcher.job_name is a prefix: each array is named ``<job_name>.<run id>.g<generation>.c<chunk>``, and
#: accounting (slurmdbd) keeps 255 characters of a job name, so the prefix leaves room for the rest.
JOB_NAME_PREFIX_MAX = 160


@dataclass
class SlurmOptions(LauncherSettings):
    """launcher=slurm's keys (conf/launcher/slurm.yaml composes on them as launcher/slurm_schema). One array task =
    one member (or members_per_gpu packed members) with these resources."""

    partition: Optional[str] = setting(None, "sbatch --partition; null: the cluster's default partition")
    time_min: Optional[int] = setting(None, "--time per run of a member, minutes; null: inner.timeout_s + "
                                            "kill_grace_s, rounded up")
    cpus_per_task: int = setting(1, "CPUs per member (>= train.num_threads)", composed="${resources.cpus}")
    mem_gb: Optional[float] = setting(None, "memory per member; null: the cluster's default (DefMemPerCPU x cpus)",
                                      composed="${resources.mem_gb}")
    gpus_per_node: int = setting(0, "GPUs per member (one member = one node share): 0 or 1, a member trains on one "
                                    "GPU, more are refused up front (no DDP)", composed="${resources.gpus}")
    array_parallelism: int = setting(256, "at most this many tasks of one array run at once (sbatch --array=...%N)")
    max_array_size: Optional[int] = setting(None, "members per array; null: the cluster's MaxArraySize (bigger "
                                                  "generations are split)")
    requeues: int = setting(3, "on the time limit a member requeues (same job id) and resumes from its checkpoint")
    signal_delay_s: int = setting(120, "the requeue signal comes this long before the time limit")
    job_name: str = setting("mirror-es", "prefix of each array's name: <job_name>.<run id>.g<generation>.c<chunk> "
                                         "(squeue -n finds it)")
    sbatch_extra: dict[str, Any] = setting({}, "any other sbatch option, e.g. {qos: high, account: myproj, "
                                               "constraint: a100}")
    setup: list[str] = setting([], "shell lines run before each member, e.g. [\"module load cuda/12.4\"]")
    poll_interval_s: float = setting(2.0, "how often result files are checked (no scheduler query)")
    query_interval_s: float = setting(30.0, "at most one batched sacct call per this many seconds")
    sacct_grace_s: float = setting(60.0, "a new job missing from accounting this long after sbatch is asked for in "
                                         "squeue")
    max_pending_s: float = setting(21600.0, "a job pending this long for a reason that means it may never start "
                                            "(PartitionDown, ReqNodeNotAvail, BadConstraints, ...) is cancelled: "
                                            "timeout. Priority, Resources and QOS/association limits are waiting one's "
                                            "turn and never count")
    result_grace_s: float = setting(90.0, "a job that ended with no result.json in sight is looked at again "
                                          "(directory re-listed) this long after before it counts as lost/failed: NFS "
                                          "may hide another node's new file for up to ~60 s. A result.json the member "
                                          "wrote is never overwritten anyway")
    command_timeout_s: float = setting(60.0, "limit for one sbatch/sacct/squeue/scancel call")
    submit_attempts: int = setting(4, "tries per array chunk when sbatch fails; then the run stops (resumable) with "
                                      "the error")
    submit_backoff_s: float = setting(10.0, "wait before the 2nd try, doubled for each further try")
    python: Optional[str] = setting(None, "one command that runs python in the job (environment lines go in setup); "
                                          "null: this interpreter")
    use_srun: bool = setting(False, "false: Python replaces the batch shell (exec) and SLURM sends the requeue signal "
                                    "there (--signal=B:USR2@delay); true: the member runs as a job step under srun "
                                    "(--signal=USR2@delay). false saves a process and a controller RPC")
    members_per_gpu: int = setting(1, "members sharing one GPU (resources.members_per_gpu: 1, 2 or 4)",
                                   composed="${resources.members_per_gpu}")
    gpu_sharing: str = setting("packed", "packed: one array task holds the GPU with k x a member's CPUs and memory and "
                                         "runs k members, an antithetic pair together, each in its own process with "
                                         "its own work dir, record, ledger and log (<member dir>/member.log); works on "
                                         "any cluster. shard: one member per task asking for shards_per_gpu / k of a "
                                         "GPU's shards (--gres=shard:N), where the site's gres.conf defines shards")
    shards_per_gpu: Optional[int] = setting(None, "gpu_sharing=shard: the shards each GPU of the site has (gres.conf "
                                                  "Name=shard Count=...)")

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> "SlurmOptions":
        """Build from the launcher config node; ValueError naming the key and the fix on a bad value."""
        opts = typed_node(cls, options, "launcher", see=" (extra sbatch options go under launcher.sbatch_extra)")
        opts._validate()
        return opts

    def _validate(self) -> None:
        def bad(key: str, value: Any, want: str) -> ValueError:
            return ValueError(f"launcher.{key}={value!r} is invalid: {want}")

        positive_ints = ("cpus_per_task", "array_parallelism")
        for key in positive_ints:
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise bad(key, value, "use a positive integer")
        for key in ("gpus_per_node", "requeues", "max_lost_resubmits", "signal_delay_s"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise bad(key, value, "use an integer >= 0")
        for key in ("time_min", "max_array_size"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise bad(key, value, "use a positive integer, or null for the default")
        if self.mem_gb is not None and (not isinstance(self.mem_gb, (int, float)) or self.mem_gb <= 0):
            raise bad("mem_gb", self.mem_gb, "use a positive number of GB, or null for the cluster's default")
        for key in ("poll_interval_s", "query_interval_s", "sacct_grace_s", "kill_grace_s", "command_timeout_s",
                    "max_pending_s"):
            value = getattr(self, key)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise bad(key, value, "use a positive number of seconds")
        if (isinstance(self.result_grace_s, bool) or not isinstance(self.result_grace_s, (int, float))
                or not self.result_grace_s >= 0):
            raise bad("result_grace_s", self.result_grace_s,
                      "use seconds >= 0 (~60-90 on NFS, where another node's new file can stay invisible ~60 s)")
        if self.query_interval_s < self.poll_interval_s:
            raise bad("query_interval_s", self.query_interval_s,
                      f"scheduler queries cannot be more frequent than polls (poll_interval_s={self.poll_interval_s})")
        if not isinstance(self.sbatch_extra, Mapping):
            raise bad("sbatch_extra", self.sbatch_extra, "use a mapping of sbatch option -> value, e.g. {qos: high}")
        if not isinstance(self.setup, (list, tuple)) or not all(isinstance(line, str) for line in self.setup):
            raise bad("setup", self.setup, "use a list of shell lines, e.g. ['module load cuda']")
        if not isinstance(self.job_name, str) or not self.job_name.strip():
            raise bad("job_name", self.job_name, "use a non-empty string")
        if len(self.job_name) > JOB_NAME_PREFIX_MAX or any(c == "," or c.isspace() for c in self.job_name):
            raise bad("job_name", self.job_name,
                      f"use at most {JOB_NAME_PREFIX_MAX} characters without commas or spaces (it prefixes each "
                      "array's name, which carries the run, generation and chunk and is searched with squeue -n)")
        if not isinstance(self.submit_attempts, int) or isinstance(self.submit_attempts, bool) \
                or self.submit_attempts < 1:
            raise bad("submit_attempts", self.submit_attempts, "use a positive integer (1: no retry)")
        if not isinstance(self.submit_backoff_s, (int, float)) or isinstance(self.submit_backoff_s, bool) \
                or self.submit_backoff_s < 0:
            raise bad("submit_backoff_s", self.submit_backoff_s, "use a number of seconds >= 0")
        if self.python is not None and (not isinstance(self.python, str) or not self.python.strip()):
            raise bad("python", self.python, "use a command that starts python, or null for this interpreter")
        if self.python is not None and not self.use_srun and (
            "=" in self.python.split()[0] or any(op in self.python for op in ("&&", "||", ";", "|"))
        ):
            raise bad("python", self.python,
                      "with use_srun=false it is exec'ed in place of the batch shell, so it must be one command "
                      "(put environment and module lines in launcher.setup)")
        if self.members_per_gpu not in MEMBERS_PER_GPU_CHOICES:
            raise bad("members_per_gpu", self.members_per_gpu,
                      f"use one of {list(MEMBERS_PER_GPU_CHOICES)} (resources.members_per_gpu: members sharing one GPU)")
        if self.gpu_sharing not in GPU_SHARING:
            raise bad("gpu_sharing", self.gpu_sharing, f"use one of {list(GPU_SHARING)}")
        if self.gpu_sharing == "shard" and self.members_per_gpu > 1 and self.gpus_per_node != 1:
            raise bad("gpu_sharing", self.gpu_sharing, f"shards are parts of a GPU: members must ask for one "
                      f"(gpus_per_node={self.gpus_per_node}; resources.gpus=1)")
        if self.gpu_sharing == "shard" and self.members_per_gpu > 1 and (
                not isinstance(self.shards_per_gpu, int) or isinstance(self.shards_per_gpu, bool)
                or self.shards_per_gpu < self.members_per_gpu or self.shards_per_gpu % self.members_per_gpu):
            raise bad("shards_per_gpu", self.shards_per_gpu,
                      f"gpu_sharing=shard needs the shards each GPU of the site has (its gres.conf: Name=shard "
                      f"Count=...), a multiple of members_per_gpu={self.members_per_gpu}; each member asks for "
                      "shards_per_gpu / members_per_gpu of them")
        if self.time_min is not None and self.signal_delay_s >= self.time_min * 60:
            raise bad("signal_delay_s", self.signal_delay_s,
                      f"the requeue signal must come before the time limit (time_min={self.time_min} min)")

    @property
    def members_per_task(self) -> int:
        """Members one array task runs: members_per_gpu when they are packed into the task, else one (one member per
        task, sharing the GPU through the site's shards)."""
        return self.members_per_gpu if self.gpu_sharing == "packed" else 1

    def time_limit_min(self, timeout_s: float) -> int:
        """SLURM --time per run: time_min, or inner.timeout_s plus the kill grace, rounded up to minutes."""
        if self.time_min is not None:
            return self.time_min
        return max(1, math.ceil((float(timeout_s) + self.kill_grace_s) / 60.0))

    def signal_delay(self, timeout_s: float) -> int:
        """Seconds before the time limit at which the requeue signal comes; for a derived (possibly short)
        limit at most half-way, so the member still gets to work."""
        time_min = self.time_limit_min(timeout_s)
        return self.signal_delay_s if self.time_min else min(self.signal_delay_s, time_min * 30)

    def python_command(self, default_python: str) -> str:
        """The command that starts the member's Python. Without srun the member runs in the batch shell's
        place (``exec``): the batch step is the only one, and SLURM's ``B:`` signal must reach Python itself,
        not a bash that would only pass it on after its child exits."""
        python = self.python or default_python
        return python if self.use_srun else f"exec {python}"

    def sbatch_parameters(self, timeout_s: float, signal_name: str = "USR2") -> dict[str, Any]:
        """submitit SlurmExecutor.update_parameters(...) keywords for one generation's arrays.

        ``signal_name``: the signal submitit's job environment requeues on (submitit's USR_SIG)."""
        time_min = self.time_limit_min(timeout_s)
        delay = self.signal_delay(timeout_s)
        packed = self.members_per_task
        params: dict[str, Any] = {
            "job_name": self.job_name,
            "time": time_min,
            "cpus_per_task": self.cpus_per_task * packed,
            "array_parallelism": self.array_parallelism,
            "signal_delay_s": delay,
            "use_srun": self.use_srun,
            "stderr_to_stdout": False,
        }
        if self.partition:
            params["partition"] = self.partition
        if self.mem_gb is not None:
            params["mem"] = f"{int(self.mem_gb * 1024 * packed)}M"
        extra = dict(self.sbatch_extra)
        if self.gpus_per_node and self.gpu_sharing == "shard" and self.members_per_gpu > 1:
            assert self.shards_per_gpu is not None  # _validate
            extra.setdefault("gres", f"shard:{self.shards_per_gpu // self.members_per_gpu}")
        elif self.gpus_per_node:
            params["gpus_per_node"] = self.gpus_per_node
        # the member's save window on the time-limit warning follows this delay (core/notice_window.py)
        params["setup"] = [f"export {SIGNAL_DELAY_ENV}={delay}", *self.setup]
        if not self.use_srun:
            # submitit writes --signal=USR2@delay, which SLURM sends to job steps only; without srun there is
            # no step, so the signal goes to the batch shell (B:), which is the member's Python (exec).
            extra.setdefault("signal", f"B:{signal_name}@{delay}")
        if extra:
            params["additional_parameters"] = extra
        return params
