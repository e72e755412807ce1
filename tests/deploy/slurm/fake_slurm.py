"""Fakes of what deploy/slurm/goodput.sbatch calls, for running it without a Slurm cluster.

Each fake is a small executable on PATH that records its command line (and the environment
variables the recipe hands on) as a JSON line in ``$FAKE_SLURM_LOG``, and is as strict as the
real thing where the recipe could go wrong:

- ``goodput``: parses its arguments with the real CLI's parser (a flag `goodput` refuses is
  refused here, with its status 2); ``up`` leaves a service behind as the real one does (in a
  session of its own, its parent gone), which ``down`` stops and waits for (SIGTERM, then
  SIGKILL: the real stop, :func:`goodput.owned_process.terminate`); ``run`` exits with
  ``$FAKE_RUN_EXIT`` (``wait``: it runs until signalled, as a training job does).
- ``srun``: accepts only the options of Slurm 22.05's srun that the recipe may use, then runs
  until signalled, as the agents' step does.
- ``scontrol``: ``show hostnames`` expands a node list as Slurm does
  (:func:`goodput.supervisor.agent.slurm.expand_nodelist`), ``requeue`` is recorded; anything
  else fails.
- ``nats-server``: runs until signalled.

The recipe's ``python`` is the real one (this interpreter).

Each long-running fake writes its pid, so a test can check that the recipe stopped it.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: srun options (Slurm 22.05's names) a job step of the recipe may use; the real test runs
#: the real srun with them
SRUN_OPTIONS = {
    "--nodes",
    "--ntasks",
    "--ntasks-per-node",
    "--whole",
    "--no-kill",
    "--kill-on-bad-exit",
    "--overlap",
    "--nodelist",
    "--cpus-per-task",
    "--mem",
    "--gpus-per-node",
}
#: the variables the fakes record: what the recipe hands on to its commands
HANDED_ON = (
    "GOODPUT_NATS_URL",
    "GOODPUT_NATS_TOKEN",
    "GOODPUT_STATE_DIR",
    "GOODPUT_CKPT_DIR",
    "GOODPUT_CKPT_KEY_FILE",
)

_PRELUDE = """\
import json, os, signal, sys, time
def record(entry):
    entry["env"] = {{k: os.environ[k] for k in {handed_on!r} if k in os.environ}}
    entry["pid"] = os.getpid()
    entry["ppid"] = os.getppid()
    with open(os.environ["FAKE_SLURM_LOG"], "a") as log:
        log.write(json.dumps(entry) + "\\n")
def run_until_signalled():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    deadline = time.monotonic() + 120  # bounded: a fake never outlives its test by much
    while time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(124)
"""

_GOODPUT = """\
from goodput.tools.cli.main import build_parser
argv = sys.argv[1:]
command = next(a for a in argv if not a.startswith("-"))
remainder = argv[argv.index("--"):] if "--" in argv else []
build_parser(command).parse_args(argv[: len(argv) - len(remainder)])  # exits 2 on a bad flag
record({{"cmd": "goodput", "argv": argv}})
def services():
    with open(os.environ["FAKE_SLURM_LOG"]) as log:
        return [entry for entry in map(json.loads, log) if entry["cmd"] == "service"]
if command == "up":  # a service: in a session of its own, its parent gone, as `up` leaves it
    child = os.fork()
    if child == 0:
        os.setsid()
        parent = os.getpid()
        if os.fork() == 0:
            while os.getppid() == parent:  # until its parent has gone: then it is an orphan,
                time.sleep(0.01)  # reaped by whoever reaps orphans (the subreaper)
            import msgspec
            from goodput.owned_process import identify
            identity = msgspec.to_builtins(identify(os.getpid()))  # what `down` checks
            record({{"cmd": "service", "argv": [], "identity": identity}})
            run_until_signalled()
        os._exit(0)
    os.waitpid(child, 0)
    deadline = time.monotonic() + 30  # `up --wait`: it returns once its service is running
    while not services():
        assert time.monotonic() < deadline, "fake up: its service never started"
        time.sleep(0.01)
if command == "down":  # stops the stack's services and waits for them, as the real one does
    import msgspec
    from goodput.owned_process import ProcessIdentity, terminate
    for entry in services():
        terminate(msgspec.convert(entry["identity"], ProcessIdentity), timeout_s=10, group=True)
if command == "run":
    outcome = os.environ.get("FAKE_RUN_EXIT", "0")
    if outcome == "wait":
        run_until_signalled()
    sys.exit(int(outcome))
"""

_SRUN = """\
options = {srun_options!r}
argv = sys.argv[1:]
i = 0
while i < len(argv) and argv[i].startswith("-"):
    name = argv[i].split("=", 1)[0]
    if name not in options:
        print(f"srun: unrecognized option '{{argv[i]}}'", file=sys.stderr)
        sys.exit(1)
    i += 1
record({{"cmd": "srun", "options": argv[:i], "argv": argv[i:]}})
run_until_signalled()
"""

_SCONTROL = """\
from goodput.supervisor.agent.slurm import expand_nodelist
argv = sys.argv[1:]
if argv[:2] == ["show", "hostnames"] and len(argv) == 3:
    print("\\n".join(expand_nodelist(argv[2])))
elif argv[:1] == ["requeue"] and len(argv) == 2:
    record({{"cmd": "scontrol", "argv": argv}})
else:
    print(f"fake scontrol: not supported: {{argv}}", file=sys.stderr)
    sys.exit(1)
"""

_NATS = """\
record({{"cmd": "nats-server", "argv": sys.argv[1:]}})
run_until_signalled()
"""


def install(bin_dir: Path) -> None:
    """The fakes in ``bin_dir`` (put it on PATH before this interpreter's directory, whose
    ``python`` the recipe runs)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    prelude = _PRELUDE.format(handed_on=HANDED_ON)
    bodies = {
        "goodput": _GOODPUT.format(),
        "srun": _SRUN.format(srun_options=sorted(SRUN_OPTIONS)),
        "scontrol": _SCONTROL.format(),
        "nats-server": _NATS.format(),
    }
    for name, body in bodies.items():
        path = bin_dir / name
        path.write_text(f"#!{sys.executable}\n{prelude}{body}")
        path.chmod(0o755)
