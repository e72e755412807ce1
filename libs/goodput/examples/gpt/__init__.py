"""A small GPT trained on the CPU with DDP: the example job that goodput supervises.

Its whole training state (model, optimizer, LR schedule, RNG states, data position) can be
checkpointed and resumed bit-exactly at the same world size, and resumed at another world size
with the same global batch (gradient accumulation), so restarts, hot swaps and rescales can be
checked by comparing parameter hashes.
"""
