"""The transformers backend (flashattn2.integrations.transformers): tiny random-init Llama, Mistral (sliding
window), Gemma-2 (softcap), gpt-oss (sinks) and DeepSeek-V3 (MLA: unlike value head dim) models give the logits
and gradients of a float64 eager model within the pass rule (our error at most 3x that of the peer
implementation in bf16), with and without padding, packed sequences by position ids, and the greedy tokens of
the peer in generate()."""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
import flashattn2.integrations.transformers as fa2  # noqa: E402
from helpers import DEVICE  # noqa: E402

FACTOR = 3.0

CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128),
    "mistral": lambda: transformers.MistralConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, sliding_window=7),
    "gemma2": lambda: transformers.Gemma2Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128, sliding_window=7,
        attn_logit_softcapping=5.0, final_logit_softcapping=None, query_pre_attn_scalar=16,
        initializer_range=0.3),  # large scores, so that the softcap bites
    # attention sinks (s_aux) and alternating sliding / full layers; a mixture of experts for the MLP
    "gpt_oss": lambda: transformers.GptOssConfig(
        vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128, sliding_window=7,
        layer_types=["sliding_attention", "full_attention"], num_local_experts=4, num_experts_per_tok=2,
        rope_scaling=None),
    # DeepSeek-V3's multi-head latent attention: query/key head dim 24 (16 + 8 rotary), value head dim 16; a
    # mixture of experts after the first layer
    "deepseek_v3": lambda: transformers.DeepseekV3Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1,
        n_group=1, topk_group=1, max_position_embeddings=128, rope_scaling=None),
}


# the input-dtype comparison: sdpa where transformers offers it for the architecture, eager otherwise
PEER = {"llama": "sdpa", "mistral": "sdpa", "gemma2": "eager", "gpt_oss": "eager", "deepseek_v3": "sdpa"}


def _models(name):
    torch.manual_seed(0)
    config = CONFIGS[name]()
    # each model gets its own config: from_config records the implementation on it
    # the experts' eager loop: the default grouped matmul has no float64
    extra = {"experts_implementation": "eager"} if name in ("gpt_oss", "deepseek_v3") else {}
    ref = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="eager", **extra)
    ref = ref.to(device=DEVICE, dtype=torch.float64)
    for module in ref.modules():
        if hasattr(module, "sinks"):  # sinks the size of the scores, so that they take part
            module.sinks.data.normal_(0.0, 2.0)
    models = {"ref": ref}
    for role, impl in (("peer", PEER[name]), ("ours", fa2.ATTN_IMPLEMENTATION)):
        model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=impl,
                                                              **extra)
        model.load_state_dict(ref.state_dict())
        models[role] = model.to(device=DEVICE, dtype=torch.bfloat16)
    return models


def _err(x, ref, where):
    return (x.double() - ref.double()).abs()[where].max().item()


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("padding", [False, True])
def test_logits_and_gradients_match(name, padding):
    models = _models(name)
    torch.manual_seed(1)
    batch, seqlen = 2, 14
    ids = torch.randint(0, 128, (batch, seqlen), device=DEVICE)
    mask = torch.ones(batch, seqlen, dtype=torch.long, device=DEVICE)
    if padding:
        # right padding: with left padding the float64 eager oracle itself gives NaN (a fully masked row's NaN
        # reaches later layers through V); generate() below covers left padding against the peer
        mask[0, -3:] = 0
        mask[1, -6:] = 0
    valid = mask.bool()
    dlogits = torch.randn(batch, seqlen, 128, device=DEVICE, dtype=torch.float64)
    logits, grads = {}, {}
    for impl, model in models.items():
        model.train()  # (no dropout in these configs) gradients on
        out = model(input_ids=ids, attention_mask=mask).logits
        (out.double() * dlogits * valid[..., None]).sum().backward()
        logits[impl] = out.detach()
        grads[impl] = {n: p.grad.detach() for n, p in model.named_parameters() if "self_attn" in n}
    ours, sdpa = logits["ours"], logits["peer"]
    assert not torch.isnan(ours[valid]).any()
    err, pt_err = _err(ours, logits["ref"], valid), _err(sdpa, logits["ref"], valid)
    assert err <= FACTOR * pt_err + 1e-4, f"logits: {err:.3e} vs {PEER[name]}'s {pt_err:.3e}"
    for n, ref in grads["ref"].items():
        err = _err(grads["ours"][n], ref, slice(None))
        pt_err = _err(grads["peer"][n], ref, slice(None))
        assert err <= FACTOR * pt_err + 1e-4, f"grad of {n}: {err:.3e} vs {PEER[name]}'s {pt_err:.3e}"


def test_packed_sequences_by_position_ids_match_separate_sequences():
    model = _models("llama")["ours"].eval()
    torch.manual_seed(2)
    a, b = torch.randint(0, 128, (1, 9), device=DEVICE), torch.randint(0, 128, (1, 14), device=DEVICE)
    packed = torch.cat([a, b], dim=1)
    position_ids = torch.cat([torch.arange(9), torch.arange(14)])[None].to(DEVICE)
    with torch.no_grad():
        out = model(input_ids=packed, position_ids=position_ids).logits
        sep = torch.cat([model(input_ids=a).logits, model(input_ids=b).logits], dim=1)
    torch.testing.assert_close(out, sep, rtol=0, atol=3e-2)
    # without the position ids the second sequence would see the first: the test can tell the difference
    with torch.no_grad():
        joined = model(input_ids=packed).logits
    assert (joined[0, 9:] - sep[0, 9:]).abs().max() > 0.1


@pytest.mark.parametrize("name", ["llama", "gemma2", "gpt_oss", "deepseek_v3"])
def test_generate_gives_the_peers_greedy_tokens(name):
    models = _models(name)
    torch.manual_seed(3)
    ids = torch.randint(1, 128, (2, 10), device=DEVICE)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding, as generate() wants
    tokens = {}
    for role in ("peer", "ours"):
        model = models[role].eval()
        model.generation_config.pad_token_id = 0
        tokens[role] = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, do_sample=False)
    assert torch.equal(tokens["peer"], tokens["ours"])


def test_what_it_cannot_honour_raises():
    model = _models("llama")["ours"]
    ids = torch.randint(0, 128, (1, 8), device=DEVICE)
    with pytest.raises(NotImplementedError, match="output_attentions"):
        model(input_ids=ids, output_attentions=True)
    assert "flash" not in fa2.ATTN_IMPLEMENTATION
