"""The supervisor stack as a library: launch and stop it (:mod:`.launcher`), follow a job on
it (:mod:`.watch`). The `goodput` CLI, the demo, the benchmarks and the chaos tool use it."""
