"""Keys a member's inner config carries from its resources (one owner; imports nothing, so that the typed inner
config can read them without the run store)."""

#: the inner-config key of a member whose resources ask for GPUs (resources.gpus >= 1): how many. The member refuses
#: to train without a usable GPU (inner_loop/member/device.py); absent: a CPU member, or one that takes what it finds
MEMBER_GPUS_KEY = "gpus"
#: the inner-config key of a GPU member's share of its GPU's memory (resources.gpu_memory_fraction; absent: all of it,
#: one member per GPU): its generation cache and the full form's chunks are sized from that budget, never from what
#: the device has free (members packed on one GPU would each take the others' memory)
MEMBER_GPU_MEMORY_KEY = "gpu_memory_fraction"
#: the inner-config key of a GPU member that shares its GPU with others (resources.members_per_gpu >= 2): how many
#: members share it. Its memory share (MEMBER_GPU_MEMORY_KEY) is already divided by it; the member names both when
#: it runs out of memory, and staggers its vLLM engine's start with the others on the card
MEMBER_GPU_SHARERS_KEY = "members_per_gpu"
#: the environment variable a packed SLURM task sets for each member it starts: how many of its members it started
#: together on the card. Fewer than members_per_gpu (the odd member of a generation, a requeued task's survivors):
#: each takes the card divided among those present, not among k (inner_loop/gpu_share.py)
MEMBERS_ON_GPU_ENV = "MIRROR_ES_MEMBERS_ON_GPU"
