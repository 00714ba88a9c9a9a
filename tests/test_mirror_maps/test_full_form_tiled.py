"""The full form from hidden states in vocabulary tiles (mirror_maps.tiled) equals the full form over logits
(mirror_maps.full_divergence with log_softmax) in value and gradient, for every potential the neural map is made of,
KL and ProbL2; its per-token gradient norms equal autograd's; and the trainer's full form equals the loss computed
from the models' logits. Run under each ATEN_CPU_CAPABILITY (default, avx2, avx512) and MKL_CBWR=COMPATIBLE."""
from __future__ import annotations

import pytest
import torch

from mirror_maps import KL, VECTOR_LENGTH, NeuralMirrorMap, ProbL2, full_divergence
from mirror_maps.neurons import BLOCK_NAMES, NEURONS_PER_BLOCK
from mirror_maps.potentials import Potential
from mirror_maps.tiled import MIN_COLUMNS, TILE_BYTES_PER_ENTRY as ENTRY, FullForm, tile_shape, tiled_full_form
from helpers import SMALL_SHAPE


def _neural(vector: torch.Tensor) -> NeuralMirrorMap:
    return NeuralMirrorMap.from_vector(vector, "none")


def _block_alone(block: int) -> NeuralMirrorMap:
    """The map with only the 21 neurons of one activation block (v, w, b > 0), the rest zero."""
    generator = torch.Generator().manual_seed(100 + block)
    vector = torch.zeros(VECTOR_LENGTH, dtype=torch.float64)
    neurons = slice(block * NEURONS_PER_BLOCK, (block + 1) * NEURONS_PER_BLOCK)
    for offset, scale in ((0, 1.0), (126, 3.0), (252, 0.5)):  # v, w, b
        vector[offset:][neurons] = torch.rand(NEURONS_PER_BLOCK, generator=generator, dtype=torch.float64) * scale
    return _neural(vector)


def _potentials() -> dict[str, Potential]:
    """KL, ProbL2 and the neural map by part: each activation block alone, the quadratic (a) and the entropy (c) term
    alone, the authors' random map, a signed map, and one with neurons whose kink lies among the probabilities."""
    out: dict[str, Potential] = {"kl": KL(), "prob_l2": ProbL2()}
    out.update({f"nm_{name}": _block_alone(block) for block, name in enumerate(BLOCK_NAMES)})
    for index, name in ((378, "nm_a"), (379, "nm_c")):
        vector = torch.zeros(VECTOR_LENGTH, dtype=torch.float64)
        vector[index] = 1.0
        out[name] = _neural(vector)
    generator = torch.Generator().manual_seed(17)
    signed = torch.rand(VECTOR_LENGTH, generator=generator, dtype=torch.float64) * 2 - 1
    kinks = signed.abs()
    kinks[252 + 42:252 + 105:3] = 0.0  # b = 0: a kink at y = 0
    kinks[252 + 43:252 + 105:3] = -kinks[126 + 43:126 + 105:3] * 5e-4  # a kink inside (0, 1e-3)
    out.update({"nm_authors": NeuralMirrorMap.random_init(42, dtype=torch.float64), "nm_signed": _neural(signed),
                "nm_kinks": _neural(kinks)})
    return out


POTENTIALS = _potentials()


def _problem(dtype: torch.dtype, trainable_head: bool, seed: int = 0, positions: int = 5, hidden: int = 6,
             vocab: int = 1500):
    """Hidden states, heads and targets whose softmax has entries above and below the neural map's Taylor range
    (2^-10), a reference near the policy, and random loss weights for log p(y) and D."""
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=dtype) * scale

    h = randn(positions, hidden, scale=1.5).requires_grad_(True)
    weight = randn(vocab, hidden).requires_grad_(trainable_head)
    bias = randn(vocab, scale=0.5).requires_grad_(trainable_head)
    ref_h = h.detach() + randn(positions, hidden, scale=0.3)
    ref_weight = weight.detach() + randn(vocab, hidden, scale=0.1)
    targets = torch.randint(0, vocab, (positions,), generator=generator)
    targets[0] = vocab - 1  # one in the last, partial tile
    return h, weight, bias, ref_h, ref_weight, bias.detach(), targets, randn(positions), randn(positions)


def _over_logits(potential, h, weight, bias, ref_h, ref_weight, ref_bias, targets, temperature):
    """The reference: both models' whole logits, log_softmax and mirror_maps.full_divergence."""
    dtype = torch.promote_types(h.dtype, torch.float32)
    logits = (h @ weight.t() + bias).to(dtype) / temperature
    ref_logits = (ref_h @ ref_weight.t() + ref_bias).to(dtype) / temperature
    logps = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logps, full_divergence(potential, logits, ref_logits), logits


def _close(got: torch.Tensor, expected: torch.Tensor, tolerance: float) -> None:
    """Within ``tolerance`` relative to the tensor's largest entry (an entry near 0 is judged against the scale)."""
    torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance * float(expected.abs().max()))


@pytest.mark.parametrize("trainable_head", [False, True], ids=["frozen_head", "trained_head"])
@pytest.mark.parametrize("name", list(POTENTIALS))
def test_value_and_gradient_equal_the_full_form_over_logits_in_float32(name, trainable_head):
    potential = POTENTIALS[name]
    if isinstance(potential, NeuralMirrorMap):
        potential = NeuralMirrorMap.from_vector(potential.to_vector().float(), "none")
    h, weight, bias, ref_h, ref_weight, ref_bias, targets, g_logp, g_div = _problem(torch.float32, trainable_head)
    temperature = 0.8
    logps, divergence, _ = _over_logits(potential, h, weight, bias, ref_h, ref_weight, ref_bias, targets, temperature)
    inputs = [h, weight, bias] if trainable_head else [h]
    expected = torch.autograd.grad((g_logp * logps).sum() + (g_div * divergence).sum(), inputs)
    # tiles of 3 positions x 700 entries: row blocks, the online logsumexp across 5 tiles, targets in several
    got = tiled_full_form(potential, h, weight, ref_h, ref_weight, targets, bias=bias, ref_bias=ref_bias,
                          temperature=temperature, rows=3, workspace_bytes=3 * 700 * ENTRY)
    assert divergence.abs().max() > 0
    _close(got.divergence, divergence.detach(), 1e-5)
    _close(got.logps, logps.detach(), 1e-5)
    grads = torch.autograd.grad((g_logp * got.logps).sum() + (g_div * got.divergence).sum(), inputs)
    for value, reference in zip(grads, expected):
        _close(value, reference, 1e-5)


@pytest.mark.parametrize("name", ["kl", "prob_l2", "nm_authors", "nm_signed", "nm_log", "nm_exp"])
def test_float64_agrees_to_roundoff_and_the_tile_shape_changes_nothing(name):
    potential = POTENTIALS[name]
    h, weight, bias, ref_h, ref_weight, ref_bias, targets, g_logp, g_div = _problem(torch.float64, True, seed=1)
    logps, divergence, _ = _over_logits(potential, h, weight, bias, ref_h, ref_weight, ref_bias, targets, 1.0)
    expected = torch.autograd.grad((g_logp * logps).sum() + (g_div * divergence).sum(), [h, weight, bias])
    for rows, workspace in ((None, None), (1, ENTRY * 512), (5, ENTRY * 5 * 1500)):
        got = tiled_full_form(potential, h, weight, ref_h, ref_weight, targets, bias=bias, ref_bias=ref_bias,
                              rows=rows, workspace_bytes=workspace)
        _close(got.divergence, divergence.detach(), 1e-10)
        _close(got.logps, logps.detach(), 1e-12)
        grads = torch.autograd.grad((g_logp * got.logps).sum() + (g_div * got.divergence).sum(), [h, weight, bias])
        for value, reference in zip(grads, expected):
            _close(value, reference, 1e-10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", ["kl", "prob_l2", "nm_authors", "nm_signed"])
def test_the_per_token_gradient_norms_equal_autograds_wrt_the_logits(name, dtype):
    """||d log p(y)/dz|| and ||dD/dz|| per position, which the logit-space gradient share needs, from the tiles'
    sums (no logits); near the reference too, where ||dD/dz|| is a small difference of the sums (kept in float64)."""
    potential = POTENTIALS[name]
    if dtype == torch.float32 and isinstance(potential, NeuralMirrorMap):
        potential = NeuralMirrorMap.from_vector(potential.to_vector().float(), "none")
    # float32: near the reference dD/dz is the difference of two float32 log-probabilities' rounding (~1e-7 of |log p|)
    tolerance = {torch.float64: 1e-8, torch.float32: 1e-3}[dtype]
    for spread in (0.3, 1e-3):
        h, weight, bias, ref_h, ref_weight, ref_bias, targets, _, _ = _problem(dtype, False, seed=2)
        ref_h = h.detach() + spread * (ref_h - h.detach())
        ref_weight = weight + spread * (ref_weight - weight)
        # autograd in float64 on the same (rounded) logits
        logits = (h @ weight.t() + bias).detach().double().requires_grad_(True)
        ref_logits = (ref_h @ ref_weight.t() + ref_bias).double()
        exact = POTENTIALS[name]
        (grad_d,) = torch.autograd.grad(full_divergence(exact, logits, ref_logits).sum(), logits)
        (grad_logp,) = torch.autograd.grad(torch.log_softmax(logits, -1).gather(-1, targets[:, None]).sum(), logits)
        got = tiled_full_form(potential, h, weight, ref_h, ref_weight, targets, bias=bias, ref_bias=ref_bias,
                              rows=4, workspace_bytes=4 * 500 * ENTRY, with_norms=True)
        assert got.divergence_norms.dtype == dtype and got.divergence_norms.min() > 0
        torch.testing.assert_close(got.policy_norms.double(), grad_logp.norm(dim=-1), rtol=tolerance, atol=0.0)
        torch.testing.assert_close(got.divergence_norms.double(), grad_d.norm(dim=-1), rtol=tolerance, atol=0.0)


def test_the_slope_of_every_potential_is_the_derivative_of_its_value():
    """bregman_and_slope_from_logprobs: the closed forms (KL, ProbL2, the neural map's Taylor polynomial and exact
    neurons) against autograd through bregman_from_logprobs, in float64, on probabilities on both sides of 2^-10."""
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 1500, generator=generator, dtype=torch.float64) * 2.5
    logp = torch.log_softmax(logits, -1)
    logq = torch.log_softmax(logits + 0.5 * torch.randn(4, 1500, generator=generator, dtype=torch.float64), -1)
    exp_heavy = POTENTIALS["nm_signed"].to_vector().abs()
    exp_heavy[126 + 105:126 + 126] = 150.0  # |w| y0 large: exp neurons left to the exact formulas
    potentials = {**POTENTIALS, "nm_exp_exact": _neural(exp_heavy)}
    for name, potential in potentials.items():
        value, slope = potential.bregman_and_slope_from_logprobs(logp, logq)
        leaf = logp.clone().requires_grad_(True)
        expected_value = potential.bregman_from_logprobs(leaf, logq)
        (expected_slope,) = torch.autograd.grad(expected_value.sum(), leaf)
        _close(value, expected_value.detach(), 1e-12)
        _close(slope, expected_slope, 1e-10)
        assert not slope.requires_grad, name


def test_tiles_fit_their_budget_and_keep_every_position_in_one_row_block_when_they_can():
    vocab = 151_936
    rows, columns = tile_shape(32, vocab, 64 * 2**20)
    assert rows == 32 and columns * rows * ENTRY <= 64 * 2**20
    positions = 64 * 256  # mbpp_qwen3's batch, on CUDA: the rows shrink, the columns stay at MIN_COLUMNS
    rows, columns = tile_shape(positions, vocab, 2 * 2**30)
    blocks = -(-positions // rows)
    assert columns == MIN_COLUMNS and rows * columns * ENTRY <= 2 * 2**30
    assert blocks * rows - positions < blocks  # row blocks of equal size
    assert tile_shape(10, 50, 10**9) == (10, 50)
    assert tile_shape(10, 50, 10**9, rows=3) == (3, 50) and tile_shape(10, 50, ENTRY * 40, rows=4)[1] == 10


def test_bad_shapes_are_refused():
    h, weight = torch.zeros(2, 3, 4), torch.zeros(11, 4)
    with pytest.raises(ValueError, match="leading dimensions"):
        tiled_full_form(KL(), h, weight, h, weight, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="vocabularies"):
        tiled_full_form(KL(), h, weight, h, torch.zeros(12, 4), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="token ids"):
        tiled_full_form(KL(), h, weight, h, weight, torch.full((2, 3), 11))
    result = tiled_full_form(KL(), h, weight, h, weight, torch.zeros(2, 3, dtype=torch.long))
    assert isinstance(result, FullForm) and result.divergence.shape == (2, 3) and result.policy_norms is None


def test_a_bfloat16_projection_matches_bfloat16_logits():
    """compute_dtype=bfloat16 (a GPU run's autocast): the projection is rounded as the model's own bf16 LM head rounds
    its logits, then taken to float32 and divided by the temperature."""
    h, weight, bias, ref_h, ref_weight, ref_bias, targets, _, _ = _problem(torch.float32, False, seed=4)
    potential = KL()
    head = torch.nn.functional.linear  # the model's LM head, in bfloat16 under autocast
    logits = head(h.detach().bfloat16(), weight.bfloat16(), bias.bfloat16()).float() / 0.8
    ref_logits = head(ref_h.bfloat16(), ref_weight.bfloat16(), ref_bias.bfloat16()).float() / 0.8
    got = tiled_full_form(potential, h, weight, ref_h, ref_weight, targets, bias=bias, ref_bias=ref_bias,
                          temperature=0.8, compute_dtype=torch.bfloat16, rows=5, workspace_bytes=5 * 1500 * ENTRY)
    _close(got.divergence, full_divergence(potential, logits, ref_logits), 1e-5)
    assert got.logps.dtype == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device; the CPU paths are tested above")
@pytest.mark.parametrize("name", ["kl", "nm_authors"])
def test_on_cuda_the_tiles_agree_with_the_cpu(name):
    """Values, norms and gradients on the device equal the CPU's (float32), and stay on the device."""
    potential = POTENTIALS[name]
    if isinstance(potential, NeuralMirrorMap):
        potential = NeuralMirrorMap.from_vector(potential.to_vector().float(), "none")
    results = []
    for device in ("cpu", "cuda"):
        h, weight, bias, ref_h, ref_weight, ref_bias, targets, g_logp, g_div = (
            x.detach().to(device) for x in _problem(torch.float32, True, seed=5))
        h.requires_grad_(True), weight.requires_grad_(True)
        if isinstance(potential, torch.nn.Module):
            potential.to(device)
        got = tiled_full_form(potential, h, weight, ref_h, ref_weight, targets, bias=bias, ref_bias=ref_bias,
                              temperature=0.8, rows=3, workspace_bytes=3 * 700 * ENTRY, with_norms=True)
        grads = torch.autograd.grad((g_logp * got.logps).sum() + (g_div * got.divergence).sum(), [h, weight])
        assert all(x.device.type == device for x in (*got, *grads))
        results.append([x.detach().cpu() for x in (*got, *grads)])
    for value, reference in zip(*reversed(results)):
        _close(value, reference, 1e-5)

# ------------------------------------------------------------------ the trainer's full form


@pytest.mark.parametrize("lora_r", [0, 4], ids=["full_fine_tuning", "lora"])
def test_the_trainers_full_form_equals_the_loss_over_the_models_logits(tiny_dir, tmp_path, lora_r):
    """The trainer takes the completion positions' hidden states and the LM heads (the reference's: the frozen copy,
    or the base with the adapter disabled) at its temperature; its loss and every parameter's gradient equal those
    of the same loss over the models' own logits, as the trainer computed it before the tiles."""
    from datasets import Dataset
    from trl import GRPOConfig

    from inner_loop.config import DivergenceConfig, ModelConfig
    from inner_loop.grpo.trainer import MirrorGRPOTrainer
    from inner_loop.loss.compose import compose_loss
    from inner_loop.loss.policy_terms import PolicyInputs
    from inner_loop.loss.regularizers import build_regularizer
    from inner_loop.models.loading import load_policy

    torch.manual_seed(0)
    model, tok = load_policy(ModelConfig(lora_r=lora_r, lora_alpha=8, **SMALL_SHAPE), tiny_dir)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=3, beta=0.0, loss_type="dr_grpo", report_to=[], use_cpu=True,
                      temperature=0.8, max_steps=1, bf16=False)
    regularizer = build_regularizer(DivergenceConfig(name="neural_mirror", form="full", coef=50.0))
    trainer = MirrorGRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                                args=args, train_dataset=Dataset.from_dict({"prompt": ["1+1="] * 4}),
                                processing_class=tok, regularizer=regularizer)
    trainer.model.train()
    with torch.no_grad():
        for param in trainer.model.parameters():
            if param.requires_grad:
                param.add_(0.3 * torch.randn_like(param))
    prompt = torch.tensor([tok("12+3=", add_special_tokens=False)["input_ids"]] * 2)
    completion = torch.tensor([tok("15", add_special_tokens=False)["input_ids"] + [tok.eos_token_id],
                               tok("1", add_special_tokens=False)["input_ids"] + [tok.eos_token_id, tok.pad_token_id]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    batch = {"prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt), "completion_ids": completion,
             "completion_mask": mask, "advantages": torch.tensor([0.5, -0.5])}
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    got = trainer._compute_loss(trainer.model, batch)
    got_grads = torch.autograd.grad(got, params)

    ids, attention = torch.cat([prompt, completion], 1), torch.cat([torch.ones_like(prompt), mask], 1)

    def completion_logits(module):
        return module(input_ids=ids, attention_mask=attention).logits[:, prompt.size(1) - 1:-1].float() / 0.8

    logits = completion_logits(trainer.model)
    with torch.no_grad(), trainer._reference(trainer.model) as ref:
        ref_logits = completion_logits(ref)
    logps = torch.log_softmax(logits, -1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)
    divergence = full_divergence(regularizer.potential, logits, ref_logits)
    parts = compose_loss(PolicyInputs(logps, logps.detach(), batch["advantages"], mask.float()),
                         trainer.policy_params, trainer.policy_term, divergence, 50.0, "dr_grpo", 3)
    expected_grads = torch.autograd.grad(parts.loss, params)
    assert divergence.sum() > 0
    torch.testing.assert_close(got, parts.loss, rtol=1e-5, atol=1e-7)
    for value, reference in zip(got_grads, expected_grads):
        _close(value, reference, 1e-4)
    # a model whose forward softcaps (or scales) its logits: the tiles would not, so it is refused, naming the key
    config = trainer.accelerator.unwrap_model(trainer.model).config
    config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        trainer._compute_loss(trainer.model, batch)
