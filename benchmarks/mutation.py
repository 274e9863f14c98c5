"""Mutation score of the core's arithmetic and glue (docs/benchmarks.md, "Mutation score of the core").

Each target is one module (or some functions of one) and the tests that cover it. For each, in a fresh copy of the
repository's files (``git ls-files``: tracked, and untracked files git does not ignore) under ``--work``, mutmut
(the ``mutation`` extra) writes every single-point mutant of the target's functions (an operator, a constant, a
comparison, a call's argument, ...), runs the target's tests once to learn which test calls which function, then,
for each mutant, the tests that call its function, stopping at the first failure: a failure kills the mutant. One
worker (``--max-children 1``), one target after another. Not part of CI.

    python benchmarks/mutation.py                  # every target
    python benchmarks/mutation.py credit auction   # some of them
    python benchmarks/mutation.py --list           # the targets, their modules and tests
    python benchmarks/mutation.py --mutants NAME   # only these mutants (mutmut's names, as printed), again
    python benchmarks/mutation.py --no-run bid_branches   # the verdicts of the copy already under --work

Prints, per target: the mutants, killed (a timeout counts as killed: the mutant changed behaviour), survived, with
no test, not run (a run stopped part way: ``--no-run`` reads such a copy's verdicts), the listed equivalents
(``EQUIVALENT``: mutants no test can kill, each with why) and the score, killed / (mutants run - equivalents); then
each survivor's diff. ``--json PATH`` writes the same as JSON.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Target:
    module: str  #: the file mutated, from the repository root
    tests: tuple[str, ...]  #: the test files that cover it
    keyword: str | None = None  #: a ``pytest -k`` expression narrowing them (None: all their tests)
    functions: tuple[str, ...] = ()  #: mutmut key patterns (``x_fn``, ``xǁClassǁmethod``) to mutate; () = all

    @property
    def dotted(self) -> str:
        return self.module.removesuffix(".py").replace("/", ".")

    def pytest_args(self) -> list[str]:
        return [*self.tests, *(["-k", self.keyword] if self.keyword else [])]

    def patterns(self) -> list[str]:
        """Mutant-name patterns of the functions mutated (``mutmut run`` arguments)."""
        return [f"{self.dotted}.{f}__mutmut_*" for f in self.functions] or [f"{self.dotted}.*"]


_FAST = ("tests/test_bid_branches.py", "tests/test_core_edges.py")
_PAIRS = tuple(
    f"x_{f}"
    for f in "pick_contested window_score forced_turns _branch_pairs preference_rows _tracked _importance".split()
)
_GLUE = tuple(
    f"x_{f}"
    for f in "_resample resample_lower resample_higher forced_slot run_branches branch_slots bid_update".split()
)

#: What is mutated, and against which tests (each selection small: it runs once per mutant of a function it calls).
TARGETS: dict[str, Target] = {
    "credit": Target("swarm_runtime/core/credit.py", ("tests/test_credit.py", "tests/test_core_edges.py")),
    "auction": Target("swarm_runtime/core/auction.py", ("tests/test_auction.py", "tests/test_core_edges.py")),
    "losses": Target("swarm_runtime/learn/losses.py", ("tests/test_losses.py", "tests/test_core_edges.py")),
    "importance": Target(
        "swarm_runtime/sampling/mismatch.py",
        ("tests/test_core_edges.py", "tests/test_rollout.py", "tests/test_training.py"),
        "test_core_edges or mismatch or importance or bid_loss or action_and_bid_steps",
    ),
    # the bid pairs likewise: their unit tests, then the survivors with the paying-domain tests (bid_pairs+pay)
    "bid_pairs": Target("swarm_runtime/learn/bid.py", _FAST, None, _PAIRS),
    "bid_pairs+pay": Target("swarm_runtime/learn/bid.py", (*_FAST, "tests/test_branch_pairs_pay.py"), None, _PAIRS),
    # the branch glue and the horizon stop against their unit tests (each mutant ~2 s); the survivors of those
    # again against the paying-domain tests too, the "+pay" targets: `--mutants NAME ... bid_branches+pay`
    "bid_branches": Target("swarm_runtime/learn/bid.py", _FAST, None, _GLUE),
    "bid_branches+pay": Target("swarm_runtime/learn/bid.py", (*_FAST, "tests/test_branch_pairs_pay.py"), None, _GLUE),
    "horizon_stop": Target("swarm_runtime/core/loop.py", _FAST, None, ("x_settle",)),
    "horizon_stop+pay": Target(
        "swarm_runtime/core/loop.py", (*_FAST, "tests/test_branch_pairs_pay.py"), None, ("x_settle",)
    ),
    "adapter_sync": Target(
        "swarm_runtime/sampling/sync.py",
        ("tests/test_adapter_sync.py",),
        functions=("xǁAdapterSyncǁ*", "x_version_name", "x_adapter_rank", "x_lora_slots"),
    ),
    "env_snapshot": Target(
        "swarm_runtime/core/env.py",
        ("tests/test_core_edges.py", "tests/test_conformance.py", "tests/test_training.py"),
        "test_core_edges or exact_state or conformance",
        ("xǁDomainEnvǁsnapshot", "xǁDomainEnvǁrestore", "xǁValidatedEnvǁsnapshot", "xǁValidatedEnvǁrestore"),
    ),
    "vln_snapshot": Target(
        "swarm_domains/vln_ce/sim.py",
        ("tests/domains/test_vln_ce.py",),
        "snapshot or conformance or noop or invalid",
        ("xǁ*ǁsnapshot", "xǁ*ǁrestore"),
    ),
}

#: Mutants no test can kill, with why (mutmut's names; they hold for the commit docs/benchmarks.md names).
_LEVELS = "only a first bid >= 1 tells it apart: bid levels are in [0, 1) (algo.bid_levels, config/keys.py)"
_TIES = "`>=` for `>` between a pair's two scores: the tied pairs were dropped just before"
_DEFAULT = "drops the last argument of AuctionResult, whose default is the same 0.0"
_FLOAT32 = "the weights' tensor is float32 without the dtype too: the advantages' (a tensor of Python floats)"
_OVERWRITTEN = "the list's initial values are all overwritten by the loop below"
EQUIVALENT: dict[str, str] = {
    "swarm_runtime.core.credit.x_bucket_brigade__mutmut_5": _OVERWRITTEN,
    "swarm_runtime.core.credit.x_bucket_brigade__mutmut_7": "v_next starts at 1, but it is multiplied by b_next = 0",
    "swarm_runtime.core.credit.x_bucket_brigade__mutmut_8": "b_next starts at 1, but it multiplies v_next = 0",
    "swarm_runtime.core.credit.x_reward_to_go__mutmut_3": _OVERWRITTEN,
    "swarm_runtime.core.credit.x_discarded_passback__mutmut_11": _LEVELS,
    "swarm_runtime.core.credit.x_discarded_passback__mutmut_13": _LEVELS,
    "swarm_runtime.core.credit.x_discarded_passback__mutmut_14": _LEVELS,
    "swarm_runtime.core.credit.x_discarded_passback__mutmut_15": _LEVELS,
    "swarm_runtime.learn.losses.x_pair_weights__mutmut_20": "the mean of no margins is never used: no pairs, no weights",
    "swarm_runtime.sampling.mismatch.x_importance_weight__mutmut_12": "a clamp at 701 instead of 700 changes "
    "min(cap, e^x) only for a cap above e^700; algo.is_cap is at most 1e6 (config/keys.py)",
    "swarm_runtime.learn.bid.x_preference_rows__mutmut_25": _TIES,
    "swarm_runtime.learn.bid.x_preference_rows__mutmut_26": _TIES,
    "swarm_runtime.learn.bid.x__importance__mutmut_21": "a row's weight without a cap (2.0 for 1.0) is never read: "
    "_bradley_terry_chunk multiplies by the weights only under is_cap",
    "swarm_runtime.core.auction.x_auction__mutmut_31": _DEFAULT,
    "swarm_runtime.core.auction.x_round_robin__mutmut_12": _DEFAULT,
    "swarm_runtime.core.auction.x_round_robin__mutmut_13": _DEFAULT,
    "swarm_runtime.learn.losses.x_reinforce_chunk__mutmut_14": "asks for per-token log-probs it then leaves unread",
    "swarm_runtime.learn.losses.x_reinforce_chunk__mutmut_32": "untracked, per_token is None: `or` is as falsy",
    "swarm_runtime.learn.losses.x_reinforce_chunk__mutmut_56": _FLOAT32,
    "swarm_runtime.learn.losses.x_reinforce_chunk__mutmut_58": _FLOAT32,
}

#: mutmut's verdicts as this script counts them
KILLED, SURVIVED, NO_TESTS, NOT_RUN = {"killed", "timeout", "segfault"}, {"survived"}, {"no tests"}, {"not checked"}


@dataclass
class Outcome:
    target: str
    verdicts: dict[str, str] = field(default_factory=dict)  #: mutant -> mutmut's verdict
    diffs: dict[str, str] = field(default_factory=dict)  #: survivor -> its diff
    seconds: float = 0.0

    def count(self, kinds: set[str]) -> int:
        return sum(v in kinds for m, v in self.verdicts.items() if m not in EQUIVALENT)

    @property
    def equivalent(self) -> int:
        return sum(m in EQUIVALENT for m in self.verdicts)

    @property
    def score(self) -> float:
        counted = len(self.verdicts) - self.equivalent - self.count(NOT_RUN)
        return self.count(KILLED) / counted if counted else 1.0

    def row(self) -> dict:
        return {
            "target": self.target,
            "module": TARGETS[self.target].module,
            "mutants": len(self.verdicts),
            "killed": self.count(KILLED),
            "survived": self.count(SURVIVED),
            "no_tests": self.count(NO_TESTS),
            "not_run": self.count(NOT_RUN),
            "equivalent": self.equivalent,
            "score": round(self.score, 4),
            "seconds": round(self.seconds),
            "survivors": {
                m: self.diffs.get(m, "")
                for m, v in self.verdicts.items()
                if v not in KILLED | NOT_RUN and m not in EQUIVALENT
            },
        }


def head_commit() -> str:
    """The checkout's commit, and whether files differ from it."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return f"{commit.stdout.strip()}{' (with uncommitted changes)' if dirty else ''}"


def repo_files(root: Path) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=root, capture_output=True, text=True
    )
    if out.returncode != 0:
        sys.exit(f"mutation: {root} is not a git checkout: {out.stderr.strip()}")
    return [f for f in out.stdout.splitlines() if (root / f).is_file() or (root / f).is_symlink()]


def fresh_copy(root: Path, dest: Path) -> None:
    """The repository's files (not its git folder, caches or ignored outputs) copied to ``dest``."""
    if dest.exists():
        shutil.rmtree(dest)
    for f in repo_files(root):
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        src = root / f
        if src.is_symlink():
            os.symlink(os.readlink(src), dest / f)
        else:
            shutil.copy2(src, dest / f)


def mutmut_config(t: Target) -> str:
    """The ``[mutmut]`` section of the copy's setup.cfg: mutate only ``t.module``, select ``t.tests``."""

    def lines(xs) -> str:
        return "".join(f"\n    {x}" for x in xs)

    return (
        "[mutmut]\n"
        f"source_paths ={lines(['swarm_runtime', 'swarm_domains', 'swarm_plugins'])}\n"
        f"only_mutate ={lines([t.module])}\n"
        f"pytest_add_cli_args_test_selection ={lines(t.pytest_args())}\n"
        f"pytest_add_cli_args ={lines(['-p', 'no:cacheprovider'])}\n"
        "process_isolation = forkserver\n"
        "use_git_change_detection = false\n"
    )


def mutmut(args: list[str], cwd: Path, log) -> subprocess.CompletedProcess:
    """``mutmut ARGS`` in ``cwd`` (the copy): the mutants' copy first on the path, one torch thread."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    exe = Path(sys.executable).with_name("mutmut")
    cmd = [str(exe) if exe.exists() else "mutmut", *args]
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    log.write(f"$ {' '.join(cmd)}\n{res.stdout}\n{res.stderr}\n")
    log.flush()
    return res


def verdicts(results_text: str, patterns: list[str]) -> dict[str, str]:
    """``mutmut results --all true`` lines (``    name: verdict``) of the mutants ``patterns`` name."""
    out = {}
    for line in results_text.splitlines():
        m = re.match(r"^\s+(\S+__mutmut_\d+): (.+)$", line)
        if m and any(fnmatch.fnmatch(m.group(1), p) for p in patterns):
            out[m.group(1)] = m.group(2).strip()
    return out


def run_target(name: str, work: Path, log, only: list[str] | None = None, run: bool = True) -> Outcome:
    """Target ``name``'s mutants (``only``: those of them named, mutmut's names) against its tests; ``run=False``:
    only the verdicts of the copy already under ``work``."""
    t = TARGETS[name]
    patterns = [m for m in only if any(fnmatch.fnmatch(m, p) for p in t.patterns())] if only else t.patterns()
    copy = work / name
    if not run:
        if not (copy / "mutants").is_dir():
            sys.exit(f"mutation: no run of {name} under {work} to read (run it without --no-run)")
        commit = (copy / "MUTATION_COMMIT").read_text() if (copy / "MUTATION_COMMIT").exists() else "unrecorded"
        print(f"{name}: the copy of commit {commit}", flush=True)
        return verdicts_of(name, copy, patterns, log, Outcome(name))
    fresh_copy(ROOT, copy)
    (copy / "setup.cfg").write_text(mutmut_config(t))
    (copy / "MUTATION_COMMIT").write_text(head_commit())
    t0 = time.time()
    res = mutmut(["run", "--max-children", "1", *patterns], copy, log)
    out = Outcome(name, seconds=time.time() - t0)
    if res.returncode != 0:
        tail = (res.stdout + res.stderr).strip().splitlines()[-15:]
        sys.exit(f"mutation: mutmut run failed for {name} (log: {log.name}):\n" + "\n".join(tail))
    return verdicts_of(name, copy, patterns, log, out)


def verdicts_of(name: str, copy: Path, patterns: list[str], log, out: Outcome) -> Outcome:
    """``out`` with the verdicts of ``copy``'s mutants that ``patterns`` name, and each survivor's diff."""
    out.verdicts = verdicts(mutmut(["results", "--all", "true"], copy, log).stdout, patterns)
    if not out.verdicts:
        sys.exit(f"mutation: no mutant of {patterns} found for {name} (log: {log.name})")
    for m, v in out.verdicts.items():
        if v not in KILLED | NOT_RUN and m not in EQUIVALENT:
            out.diffs[m] = mutmut(["show", m], copy, log).stdout.strip()
    return out


def report(outcomes: list[Outcome]) -> str:
    head = "| target | module | mutants | killed | survived | no tests | not run | equivalent | score | seconds |\n"
    head += "|---|---|---|---|---|---|---|---|---|---|\n"
    rows = [o.row() for o in outcomes]
    body = "".join(
        f"| {r['target']} | `{r['module']}` | {r['mutants']} | {r['killed']} | {r['survived']} | {r['no_tests']} | "
        f"{r['not_run']} | "
        f"{r['equivalent']} | {100 * r['score']:.1f}% | {r['seconds']} |\n"
        for r in rows
    )
    total = sum(r["mutants"] - r["equivalent"] - r["not_run"] for r in rows)
    killed = sum(r["killed"] for r in rows)
    tail = f"\nAll targets: {killed} of {total} mutants run killed ({100 * killed / max(total, 1):.1f}%)"
    tail += f", {sum(r['equivalent'] for r in rows)} listed as equivalent, {sum(r['not_run'] for r in rows)} not run.\n"
    for r in rows:
        for m, diff in r["survivors"].items():
            tail += f"\nSURVIVED {m}\n{diff}\n"
    return head + body + tail


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("targets", nargs="*", help=f"targets to run (default: all): {', '.join(TARGETS)}")
    ap.add_argument("--work", type=Path, default=Path("/tmp/swarm-mutation"), help="where the copies go")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    ap.add_argument("--list", action="store_true", help="print the targets and exit")
    ap.add_argument("--mutants", nargs="+", metavar="NAME", help="run only these mutants (mutmut's names, as printed)")
    ap.add_argument("--no-run", action="store_true", help="run nothing: read the verdicts of the copies under --work")
    a = ap.parse_args(argv)
    bad = [t for t in a.targets if t not in TARGETS]
    if bad:
        ap.error(f"unknown target {bad[0]!r}; valid: {', '.join(TARGETS)}")
    if a.list:
        for n, t in TARGETS.items():
            print(
                f"{n}: {t.module} [{', '.join(t.functions) or 'all functions'}] <- pytest {' '.join(t.pytest_args())}"
            )
        return 0
    if shutil.which("mutmut", path=str(Path(sys.executable).parent)) is None and shutil.which("mutmut") is None:
        print("mutation: mutmut is not installed; pip install -e '.[mutation]'", file=sys.stderr)
        return 2
    a.work.mkdir(parents=True, exist_ok=True)
    if not a.no_run:
        print(f"commit {head_commit()}", flush=True)
    outcomes = []
    with open(a.work / ("results.log" if a.no_run else "mutation.log"), "w") as log:
        names = a.targets or list(TARGETS)
        if a.mutants:  # the targets those mutants belong to
            names = [n for n in names if any(fnmatch.fnmatch(m, p) for m in a.mutants for p in TARGETS[n].patterns())]
        for name in names:
            o = run_target(name, a.work, log, a.mutants, run=not a.no_run)
            outcomes.append(o)
            r = o.row()
            print(
                f"{name}: {r['killed']}/{r['mutants'] - r['equivalent'] - r['not_run']} killed ({100 * r['score']:.1f}%), "
                f"{r['survived']} survived, {r['no_tests']} without a test, {r['not_run']} not run, {r['seconds']} s",
                flush=True,
            )
    print()
    print(report(outcomes))
    if a.json:
        a.json.write_text(json.dumps([o.row() for o in outcomes], indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
