"""On a real GPU, a member's share caps what it can allocate: an allocation past the share fails in this process
(not in a neighbour's), and its record names the share.

tests/test_inner_loop/process/test_gpu_share.py checks the member asks for the cap; this checks torch's allocator honours it.
Skipped (with its reason under -ra) where torch sees no CUDA device; run by scripts/gpu_check.sh.
"""
from __future__ import annotations

import pytest
import torch

from inner_loop.member.device import describe_device
from inner_loop.process.gpu_share import apply_memory_share, out_of_memory_reason

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device (torch.cuda.is_available() is False)")


def test_an_allocation_past_the_share_fails_within_the_member_and_names_the_share():
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    device = apply_memory_share(describe_device(), 0.25, 4)
    try:
        within = torch.empty(int(total * 0.05), dtype=torch.uint8, device="cuda")  # inside the share: fine
        del within
        with pytest.raises(torch.OutOfMemoryError) as caught:
            torch.empty(int(total * 0.35), dtype=torch.uint8, device="cuda")  # past the share, though the card has it
        reason = out_of_memory_reason(caught.value, device)
        assert reason is not None and reason.startswith(
            f"out of GPU memory within its share: 0.25 of {device['name']} ({total / 2**30:.1f} GiB)"), reason
        assert "resources.members_per_gpu=4" in reason
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)  # the other CUDA tests of this session have the card
        torch.cuda.empty_cache()
