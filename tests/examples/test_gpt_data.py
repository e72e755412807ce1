"""The synthetic corpus and the stateless, world-size-independent sampler."""

from __future__ import annotations

import pytest
import torch

from goodput.examples.gpt.data import (
    ALPHABET,
    VOCAB_SIZE,
    BatchSampler,
    decode,
    dropout_seed,
    encode,
    generate_text,
    make_corpus,
    split_micro_batches,
)


def test_corpus_is_a_function_of_the_seed() -> None:
    assert generate_text(5, 5_000) == generate_text(5, 5_000)
    assert generate_text(5, 5_000) != generate_text(6, 5_000)


def test_corpus_uses_the_fixed_alphabet_and_round_trips() -> None:
    text = generate_text(0, 20_000)
    assert len(text) >= 20_000
    assert set(text) <= set(ALPHABET)
    assert len(ALPHABET) <= VOCAB_SIZE
    assert decode(encode(text[:500])) == text[:500]


def test_corpus_has_learnable_structure() -> None:
    # Far fewer distinct words than a random string would give: a small, reused lexicon.
    words = generate_text(0, 50_000).replace(".", " ").replace(",", " ").split()
    assert len(set(words)) < 100 < len(words)


@pytest.fixture(scope="module")
def sampler() -> BatchSampler:
    return BatchSampler(make_corpus(1, 20_000), seq_len=16, seed=1)


def test_global_batch_depends_only_on_step(sampler: BatchSampler) -> None:
    first_x, first_y = sampler.global_batch(7, 12)
    again_x, again_y = BatchSampler(make_corpus(1, 20_000), 16, 1).global_batch(7, 12)
    assert torch.equal(first_x, again_x) and torch.equal(first_y, again_y)
    assert not torch.equal(first_x, sampler.global_batch(8, 12)[0])
    assert first_x.shape == (12, 16)
    assert torch.equal(first_x[:, 1:], first_y[:, :-1])  # targets are the next tokens


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 6, 12])
def test_rank_shares_tile_the_global_batch(sampler: BatchSampler, world_size: int) -> None:
    inputs, targets = sampler.global_batch(3, 12)
    shares = [
        micro_batch
        for rank in range(world_size)
        for micro_batch in sampler.rank_micro_batches(3, 12, 1, rank, world_size)
    ]
    assert [micro_batch.index for micro_batch in shares] == list(range(12))
    assert torch.equal(torch.cat([m.inputs for m in shares]), inputs)
    assert torch.equal(torch.cat([m.targets for m in shares]), targets)


def test_micro_batch_index_is_independent_of_world_size(sampler: BatchSampler) -> None:
    alone = sampler.rank_micro_batches(2, 12, 2, 0, 1)
    second_of_three = sampler.rank_micro_batches(2, 12, 2, 1, 3)
    assert [m.index for m in second_of_three] == [2, 3]
    assert torch.equal(second_of_three[0].inputs, alone[2].inputs)


@pytest.mark.parametrize(
    ("global_batch", "micro_batch", "world_size"),
    [(12, 5, 1), (12, 1, 5), (12, 2, 4), (0, 1, 1), (12, 1, 0)],
)
def test_uneven_splits_are_rejected(global_batch: int, micro_batch: int, world_size: int) -> None:
    with pytest.raises(ValueError):
        split_micro_batches(global_batch, micro_batch, world_size)


def test_corpus_too_short_for_the_sequence_is_rejected() -> None:
    with pytest.raises(ValueError, match="too short"):
        BatchSampler(encode("abc"), seq_len=16, seed=0)


def test_dropout_seeds_differ_per_step_and_micro_batch() -> None:
    seeds = {dropout_seed(0, step, index) for step in range(20) for index in range(12)}
    assert len(seeds) == 240
    assert dropout_seed(0, 1, 1) == dropout_seed(0, 1, 1)
