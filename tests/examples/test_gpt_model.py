"""The tiny GPT: shapes, tied head, causality."""

from __future__ import annotations

import math

import pytest
import torch

from goodput.examples.gpt.model import GPT, ModelConfig

CONFIG = ModelConfig(n_layer=2, d_model=32, n_head=4, seq_len=16, dropout=0.0)


@pytest.fixture
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(CONFIG).eval()


def test_logits_shape_and_initial_loss_near_uniform(model: GPT) -> None:
    tokens = torch.randint(0, CONFIG.vocab_size, (3, 16))
    targets = torch.randint(0, CONFIG.vocab_size, (3, 16))
    logits, loss = model(tokens, targets)
    assert logits.shape == (3, 16, CONFIG.vocab_size)
    assert loss is not None and abs(loss.item() - math.log(CONFIG.vocab_size)) < 0.2


def test_lm_head_is_tied_to_the_token_embedding(model: GPT) -> None:
    assert model.lm_head.weight is model.tok_emb.weight
    names = [name for name, _ in model.named_parameters()]
    assert "tok_emb.weight" in names and "lm_head.weight" not in names


def test_attention_is_causal(model: GPT) -> None:
    tokens = torch.randint(0, CONFIG.vocab_size, (1, 16))
    changed = tokens.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % CONFIG.vocab_size
    before, _ = model(tokens)
    after, _ = model(changed)
    torch.testing.assert_close(before[0, :10], after[0, :10])
    assert not torch.allclose(before[0, 10:], after[0, 10:])


def test_sequence_longer_than_the_context_is_rejected(model: GPT) -> None:
    with pytest.raises(ValueError, match="exceeds"):
        model(torch.zeros((1, 17), dtype=torch.int64))


def test_heads_must_divide_the_width() -> None:
    with pytest.raises(ValueError, match="divisible"):
        ModelConfig(d_model=30, n_head=4)
