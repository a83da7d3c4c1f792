"""Mutation testing of the modules that guard ashd (scripts/mutation): a score per module.

What runs is configured in pyproject.toml, `[tool.ashd.mutation]`: each module with the test
files that cover it, the cosmic-ray operators left out, and a timeout factor. For each module
this copies the checkout into a temporary directory (the mutations are written to disk there,
never in the checkout, so runs are safe beside editing and beside each other), checks that the
tests pass unmutated, makes every mutation with cosmic-ray, runs the module's tests against each
and prints the module's score: killed / (killed + survived), timeouts counted as killed.
Surviving mutants are listed with their diff, to be killed by a new test.

Slow by nature (one test run per mutant): not a CI gate. Run it before closing an issue that
touches one of these modules, and put the score in the closing note (docs/testing.md).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("ashd", "tests", "pyproject.toml")


@dataclass(frozen=True)
class Target:
    module: str
    tests: tuple[str, ...]


@dataclass(frozen=True)
class Score:
    module: str
    mutants: int
    killed: int
    survived: int
    timeouts: int
    incompetent: int
    seconds: float
    survivors: tuple[str, ...]
    pending: int = 0  # not run yet (a partial run)

    @property
    def percent(self) -> float:
        judged = self.killed + self.survived
        return 100.0 * self.killed / judged if judged else 0.0


def load_config() -> tuple[list[Target], list[str], float, float]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ashd"]["mutation"]
    targets = [Target(module, tuple(tests)) for module, tests in data["modules"].items()]
    return targets, list(data.get("exclude-operators", [])), float(data.get("timeout-factor", 3.0)), \
        float(data.get("min-timeout", 20.0))


def _copy_checkout(dest: Path) -> None:
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, dest / name)


def _env(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    # The copy's ashd, also in the processes the tests start (bridges, servers, zygotes).
    env["PYTHONPATH"] = str(work) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _pytest_command(tests: tuple[str, ...]) -> list[str]:
    return [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *tests]


def _bin(name: str) -> str:
    path = Path(sys.executable).parent / name
    if not path.exists():
        sys.exit(f"mutation: {name} not found next to {sys.executable}; run `source scripts/_env.sh dev`")
    return str(path)


def _sample(session: Path, size: int, seed: int) -> None:
    """Leave `size` of the pending mutants, chosen at random with `seed`, and mark the rest skipped: a
    score of a large module in bounded time that, unlike the first N, covers the whole file."""
    from cosmic_ray.work_db import WorkDB, use_db  # type: ignore[import-untyped]
    from cosmic_ray.work_item import WorkerOutcome, WorkResult  # type: ignore[import-untyped]

    with use_db(str(session), WorkDB.Mode.open) as db:
        pending = sorted(item.job_id for item in db.pending_work_items)
        keep = set(random.Random(seed).sample(pending, min(size, len(pending))))
        db.set_multiple_results([job for job in pending if job not in keep],
                                WorkResult(worker_outcome=WorkerOutcome.SKIPPED))


def run_target(target: Target, excluded: list[str], factor: float, min_timeout: float, keep: bool,
               sample: int | None = None, seed: int = 0) -> Score:
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="ashd-mut-"))
    try:
        _copy_checkout(work)
        env = _env(work)
        where = subprocess.run([sys.executable, "-c", "import ashd; print(ashd.__file__)"], cwd=work, env=env,
                               capture_output=True, text=True, check=True).stdout.strip()
        if not Path(where).is_relative_to(work):
            sys.exit(f"mutation: the copy imports ashd from {where}, not from {work}")
        base = time.monotonic()
        baseline = subprocess.run(_pytest_command(target.tests), cwd=work, env=env, capture_output=True, text=True)
        if baseline.returncode != 0:
            sys.exit(f"mutation: the tests of {target.module} fail unmutated:\n{baseline.stdout[-3000:]}")
        timeout = max(min_timeout, factor * (time.monotonic() - base))
        config = work / "cosmic-ray.toml"
        command = " ".join(_pytest_command(target.tests))
        config.write_text(
            "[cosmic-ray]\n"
            f"module-path = {json.dumps(target.module)}\n"
            f"timeout = {timeout:.0f}\n"
            "excluded-modules = []\n"
            f"test-command = {json.dumps(command)}\n"
            "[cosmic-ray.distributor]\nname = \"local\"\n"
            "[cosmic-ray.filters.operators-filter]\n"
            f"exclude-operators = {json.dumps(excluded)}\n"
        )
        session = work / "session.sqlite"
        subprocess.run([_bin("cosmic-ray"), "init", str(config), str(session)], cwd=work, env=env, check=True)
        subprocess.run([_bin("cr-filter-operators"), str(session), str(config)], cwd=work, env=env, check=True)
        if sample is not None:
            _sample(session, sample, seed)
        subprocess.run([_bin("cosmic-ray"), "exec", str(config), str(session)], cwd=work, env=env, check=True)
        dump = subprocess.run([_bin("cosmic-ray"), "dump", str(session)], cwd=work, env=env, check=True,
                              capture_output=True, text=True).stdout
        return _score(target.module, dump, time.monotonic() - started)
    finally:
        if keep:
            print(f"mutation: kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def recheck(session: Path, target: Target, factor: float, min_timeout: float) -> Score:
    """Run the current tests against the survivors of an earlier session (after adding tests).

    Valid when tests were only added since: a mutant an unchanged test killed stays killed. Each
    mutant gets `factor` times the unmutated run, timed here first (as a full run does), so that a
    loaded machine's slow run is not taken for a kill.
    """
    started = time.monotonic()
    dump = subprocess.run([_bin("cosmic-ray"), "dump", str(session)], check=True, capture_output=True,
                          text=True).stdout
    before = _score(target.module, dump, 0.0)
    work = Path(tempfile.mkdtemp(prefix="ashd-mut-"))
    try:
        _copy_checkout(work)
        env = _env(work)
        pristine = (work / target.module).read_bytes()
        base = time.monotonic()
        if subprocess.run(_pytest_command(target.tests), cwd=work, env=env, capture_output=True).returncode != 0:
            raise SystemExit(f"the tests of {target.module} fail unmutated; fix them before a recheck")
        timeout = max(min_timeout, factor * (time.monotonic() - base))
        still: list[str] = []
        for line in dump.splitlines():
            if not line.strip():
                continue
            item, result = json.loads(line)
            if not result or result.get("test_outcome") != "survived":
                continue
            mutation = item["mutations"][0]
            (work / target.module).write_bytes(pristine)
            subprocess.run([_bin("cosmic-ray"), "apply", target.module, mutation["operator_name"],
                            str(mutation["occurrence"])], cwd=work, env=env, check=True, capture_output=True)
            try:
                run = subprocess.run(_pytest_command(target.tests), cwd=work, env=env, capture_output=True,
                                     timeout=timeout, start_new_session=True)
                killed = run.returncode != 0
            except subprocess.TimeoutExpired:
                killed = True
            if not killed:
                still.append(f"{mutation['operator_name']} line {mutation['start_pos'][0]}:\n"
                             f"{result.get('diff', '').strip()}")
        newly = before.survived - len(still)
        return Score(target.module, before.mutants, before.killed + newly, len(still), before.timeouts,
                     before.incompetent, time.monotonic() - started, tuple(still), before.pending)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _score(module: str, dump: str, seconds: float) -> Score:
    counts = {"killed": 0, "survived": 0, "timeout": 0, "incompetent": 0}
    survivors: list[str] = []
    mutants = pending = 0
    for line in dump.splitlines():
        if not line.strip():
            continue
        item, result = json.loads(line)
        if result is None:
            pending += 1
            continue
        if result.get("worker_outcome") == "skipped":
            continue  # left out by exclude-operators
        mutants += 1
        if result.get("worker_outcome") == "abnormal":
            counts["incompetent"] += 1
            continue
        outcome = result.get("test_outcome")
        if outcome == "killed" and result.get("output") == "timeout":
            counts["timeout"] += 1
            continue
        if outcome == "survived":
            counts["survived"] += 1
            mutation = item["mutations"][0]
            survivors.append(f"{mutation['operator_name']} line {mutation['start_pos'][0]}:\n"
                             f"{result.get('diff', '').strip()}")
        elif outcome == "incompetent":
            counts["incompetent"] += 1
        else:
            counts["killed"] += 1
    return Score(module, mutants, counts["killed"] + counts["timeout"], counts["survived"], counts["timeout"],
                 counts["incompetent"], seconds, tuple(survivors), pending)


def main(argv: list[str] | None = None) -> int:
    targets, excluded, factor, min_timeout = load_config()
    parser = argparse.ArgumentParser(prog="scripts/mutation", description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="modules to run (a path or a part of one); default: all")
    parser.add_argument("--list", action="store_true", help="list the configured modules and their tests")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copy (session.sqlite)")
    parser.add_argument("--survivors", action="store_true", help="print the diff of every surviving mutant")
    parser.add_argument("--json", type=Path, help="also write the scores to this file")
    parser.add_argument("--unit-only", action="store_true",
                        help="only the covering tests under tests/unit/ (quick; a lower bound of the score)")
    parser.add_argument("--score-session", type=Path, metavar="SQLITE",
                        help="only score a session.sqlite (a kept or still running copy, e.g. to read a partial run)")
    parser.add_argument("--recheck", type=Path, metavar="SQLITE",
                        help="run the current tests against the survivors of this session of the one module "
                             "named (after tests were added)")
    parser.add_argument("--sample", type=int, metavar="N",
                        help="run N mutants of each module chosen at random (--seed), not all: a score in bounded "
                             "time for a large module, over the whole file")
    parser.add_argument("--seed", type=int, default=0, help="the --sample's seed (default 0)")
    args = parser.parse_args(argv)
    if args.unit_only:
        targets = [Target(t.module, tuple(p for p in t.tests if p.startswith("tests/unit/"))) for t in targets]
        targets = [t for t in targets if t.tests]
    if args.score_session:
        dump = subprocess.run([_bin("cosmic-ray"), "dump", str(args.score_session)], check=True,
                              capture_output=True, text=True).stdout
        _print(_score(str(args.score_session), dump, 0.0), args.survivors)
        return 0
    if args.recheck:
        named = [t for t in targets if any(m in t.module for m in args.modules)]
        if len(named) != 1:
            parser.error("--recheck needs the one module its session is of")
        _print(recheck(args.recheck, named[0], factor, min_timeout), args.survivors)
        return 0
    if args.list:
        for t in targets:
            print(f"{t.module}: {' '.join(t.tests)}")
        return 0
    chosen = [t for t in targets if not args.modules or any(m in t.module for m in args.modules)]
    if not chosen:
        parser.error(f"no configured module matches {args.modules}; see --list")
    scores: list[Score] = []
    for target in chosen:
        print(f"mutation: {target.module} with {' '.join(target.tests)}", flush=True)
        score = run_target(target, excluded, factor, min_timeout, args.keep, args.sample, args.seed)
        scores.append(score)
        _print(score, args.survivors)
    if args.json:
        args.json.write_text(json.dumps([{
            "module": s.module, "score": round(s.percent, 1), "mutants": s.mutants, "killed": s.killed,
            "survived": s.survived, "timeouts": s.timeouts, "incompetent": s.incompetent,
            "seconds": round(s.seconds)} for s in scores], indent=2) + "\n")
    print("\nmodule                                   score   killed  survived  timeouts  mutants  minutes")
    for s in scores:
        print(f"{s.module:<40} {s.percent:5.1f}%  {s.killed:7d}  {s.survived:8d}  {s.timeouts:8d}  {s.mutants:7d}"
              f"  {s.seconds / 60:7.1f}")
    return 0


def _print(score: Score, survivors: bool) -> None:
    print(f"{score.module}: {score.percent:.1f}% ({score.killed} killed of {score.killed + score.survived}; "
          f"{score.timeouts} by timeout, {score.incompetent} incompetent"
          + (f", {score.pending} not run yet" if score.pending else "") + f") in {score.seconds / 60:.1f} min",
          flush=True)
    if survivors:
        for text in score.survivors:
            print(re.sub(r"^", "    ", text, flags=re.M))


if __name__ == "__main__":
    sys.exit(main())
