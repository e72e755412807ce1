"""Deterministic synthetic text and a resumable, world-size-independent batch sampler.

The corpus is generated from a seed by a small probabilistic grammar over a seeded lexicon, so
it has structure a small model can learn (spelling, word order, subject-verb pairing) and needs
no download. The global batch of step ``s`` is a function of ``(seed, s)`` only; each rank takes
its contiguous share of micro-batches. So the data position is just the step counter, and the
sequence of global batches is the same whatever the world size or the number of restarts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

ALPHABET = "abcdefghijklmnopqrstuvwxyz .,\n"
VOCAB_SIZE = 32  # len(ALPHABET) rounded up; ids 30 and 31 never occur in the text
_CHAR_TO_ID = {char: index for index, char in enumerate(ALPHABET)}
_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiou"

# Distinct streams of the seed: one for the corpus, one for batch offsets, one for dropout.
_CORPUS_STREAM, _BATCH_STREAM, _DROPOUT_STREAM = 0, 1, 2


def encode(text: str) -> torch.Tensor:
    return torch.tensor([_CHAR_TO_ID[char] for char in text], dtype=torch.int64)


def decode(tokens: torch.Tensor) -> str:
    return "".join(ALPHABET[int(token)] for token in tokens)


def _make_word(rng: np.random.Generator) -> str:
    syllables = int(rng.integers(1, 4))
    return "".join(
        _CONSONANTS[rng.integers(len(_CONSONANTS))] + _VOWELS[rng.integers(len(_VOWELS))]
        for _ in range(syllables)
    )


def _make_lexicon(rng: np.random.Generator, size: int) -> list[str]:
    words: set[str] = set()
    while len(words) < size:
        words.add(_make_word(rng))
    return sorted(words)


def _zipf_weights(count: int) -> np.ndarray:
    weights = 1.0 / np.arange(1, count + 1)
    return weights / weights.sum()


def generate_text(seed: int, n_chars: int) -> str:
    """At least ``n_chars`` characters of grammatical nonsense, fully determined by ``seed``.

    Grammar: sentence = noun-phrase verb [noun-phrase] ("," conjunction sentence)? "."; each
    noun prefers a few verbs (a Markov dependency the model can pick up), word choice is Zipfian.
    """
    rng = np.random.default_rng([seed, _CORPUS_STREAM])
    nouns = _make_lexicon(rng, 48)
    verbs = _make_lexicon(rng, 24)
    adjectives = _make_lexicon(rng, 16)
    determiners = ["the", "a", "every", "no"]
    conjunctions = ["and", "but", "so"]
    preferred_verbs = [rng.choice(len(verbs), size=3, replace=False) for _ in nouns]
    noun_weights, adjective_weights = _zipf_weights(len(nouns)), _zipf_weights(len(adjectives))

    def noun_phrase() -> tuple[str, int]:
        noun = int(rng.choice(len(nouns), p=noun_weights))
        words = [determiners[rng.integers(len(determiners))]]
        if rng.random() < 0.4:
            words.append(adjectives[rng.choice(len(adjectives), p=adjective_weights)])
        words.append(nouns[noun])
        return " ".join(words), noun

    def clause() -> str:
        subject, noun = noun_phrase()
        verb = verbs[preferred_verbs[noun][rng.integers(3)]]
        if rng.random() < 0.7:
            return f"{subject} {verb} {noun_phrase()[0]}"
        return f"{subject} {verb}"

    pieces: list[str] = []
    length = 0
    while length < n_chars:
        sentence = clause()
        while rng.random() < 0.3:
            sentence += f", {conjunctions[rng.integers(len(conjunctions))]} {clause()}"
        sentence += "." + ("\n" if rng.random() < 0.2 else " ")
        pieces.append(sentence)
        length += len(sentence)
    return "".join(pieces)


def make_corpus(seed: int, n_chars: int = 200_000) -> torch.Tensor:
    """The token ids of the seeded corpus (int64)."""
    return encode(generate_text(seed, n_chars))


def derived_seed(seed: int, *keys: int) -> int:
    """A well-mixed 63-bit seed from ``seed`` and integer keys (step, micro-batch index...)."""
    state = np.random.SeedSequence([seed, *keys]).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def dropout_seed(seed: int, step: int, micro_batch_index: int) -> int:
    """Seed of the dropout masks of one micro-batch: independent of rank and world size."""
    return derived_seed(seed, _DROPOUT_STREAM, step, micro_batch_index)


@dataclass(frozen=True)
class MicroBatch:
    index: int  # position in the global batch, counted in micro-batches
    inputs: torch.Tensor  # [micro_batch, seq_len]
    targets: torch.Tensor  # inputs shifted by one token


class BatchSampler:
    """Windows of the corpus at offsets drawn from ``(seed, step)``: stateless, so resumable."""

    def __init__(self, tokens: torch.Tensor, seq_len: int, seed: int) -> None:
        if tokens.numel() <= seq_len + 1:
            raise ValueError(
                f"corpus of {tokens.numel()} tokens is too short for seq_len={seq_len}"
            )
        self.tokens = tokens
        self.seq_len = seq_len
        self.seed = seed

    def global_batch(self, step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets [batch_size, seq_len] of ``step``, the same on every rank."""
        rng = np.random.default_rng([self.seed, _BATCH_STREAM, step])
        offsets = torch.from_numpy(
            rng.integers(0, self.tokens.numel() - self.seq_len - 1, size=batch_size)
        )
        window = offsets[:, None] + torch.arange(self.seq_len + 1)[None, :]
        sequences = self.tokens[window]
        return sequences[:, :-1], sequences[:, 1:]

    def rank_micro_batches(
        self, step: int, global_batch: int, micro_batch: int, rank: int, world_size: int
    ) -> list[MicroBatch]:
        """This rank's contiguous share of the global batch of ``step``, cut in micro-batches."""
        micro_batches_per_rank = split_micro_batches(global_batch, micro_batch, world_size)
        inputs, targets = self.global_batch(step, global_batch)
        first = rank * micro_batches_per_rank
        return [
            MicroBatch(
                index=index,
                inputs=inputs[index * micro_batch : (index + 1) * micro_batch],
                targets=targets[index * micro_batch : (index + 1) * micro_batch],
            )
            for index in range(first, first + micro_batches_per_rank)
        ]


def split_micro_batches(global_batch: int, micro_batch: int, world_size: int) -> int:
    """Micro-batches per rank; the global batch must split evenly into micro-batches and ranks."""
    if global_batch <= 0 or micro_batch <= 0 or world_size <= 0:
        raise ValueError("global batch, micro-batch and world size must be positive")
    if global_batch % micro_batch:
        raise ValueError(
            f"global batch {global_batch} is not a multiple of micro-batch {micro_batch}"
        )
    micro_batches = global_batch // micro_batch
    if micro_batches % world_size:
        raise ValueError(
            f"{micro_batches} micro-batches of {micro_batch} cannot be shared by {world_size} ranks"
        )
    return micro_batches // world_size
