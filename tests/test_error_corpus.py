"""The corpus of bad inputs: every class of mistake a user can make, run through the CLI, ends in
one specific line that names the fix (docs/guarantees.md, "Bad input").

Each case runs ``myriad ...`` (the real entry point, in this process: seconds per case) against
one tiny finished pretraining run made once per session (``tiny_pretrain``) and broken copies of
its files made once per module, and checks: a non-zero exit, exactly one line on stderr of the
form ``myriad: error: ...`` holding the case's expected words (what was wrong and what to do), no
traceback, never the generic internal-error form, and no file of the run changed. The classes:
unknown names, wrong types, wrong shapes, NaN values, mismatched checkpoints, truncated files,
reused folders, bad config files read from disk, bad dataset files for ``dataset
info|validate|verify``, ``export``, ``report``, ``render``, ``eval``, ``export-policy`` and
``--init`` with a wrong file. Full disks and permissions need a child process with a write limit
or without root's permission override: :data:`WRITE_FAILURES` runs those.

:data:`NOT_COVERED` lists the inputs that still end in the generic form, with the reason (empty
when every class names its fix).
"""

from __future__ import annotations

import ctypes
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from test_bad_inputs import snapshot

from myriad.cli import main

#: The generic form of an unexpected error (myriad/cli.py): no case may end in it.
GENERIC = "run again with --debug"

#: Inputs that still end in the generic internal-error form, with why they cannot name a fix.
#: A case listed here (by id) is expected to fail the check (a strict xfail), so the list
#: shrinks as soon as its message is fixed.
NOT_COVERED: dict[str, str] = {}

# (id, arguments, words the message must hold). ``{run}`` is the finished run, ``{root}`` the
# folder of broken files (see ``corpus``), ``{tmp}`` the case's own empty folder.
CASES: list[tuple[str, list[str], str]] = [
    # -- unknown names
    ("unknown env", ["pretrain", "env=bogus", "--run-dir", "{tmp}/r"], "bogus"),
    ("unknown key", ["pretrain", "no_such_key=1", "--run-dir", "{tmp}/r"], "no_such_key"),
    ("unknown objective", ["pretrain", "objective=bogus", "--run-dir", "{tmp}/r"], "bogus"),
    ("unknown algo", ["finetune", "--algo", "bogus", "--run-dir", "{tmp}/r"], "bogus"),
    ("unknown kl preset", ["finetune", "algo.kl_preset=bogus", "--run-dir", "{tmp}/r"], "bogus"),
    ("unknown env to check", ["envs", "check", "bogus"], "bogus"),
    (
        "export unknown member",
        ["export", "{run}", "--format", "hdf5", "--out", "{tmp}/x.hdf5", "--members", "9"],
        "members [9]",
    ),
    ("eval unknown member", ["eval", "{run}", "--members", "9", "--out", "{tmp}/e.json"], "9"),
    ("render unknown member", ["render", "{run}", "--members", "9", "--out", "{tmp}/v"], "9"),
    (
        "export-policy unknown member",
        ["export-policy", "{run}", "--format", "torchscript", "--member", "9", "--out", "{tmp}/p"],
        "9",
    ),
    ("missing run", ["report", "{tmp}/nothing"], "nothing"),
    ("missing dataset", ["dataset", "info", "{tmp}/nothing.hdf5"], "nothing.hdf5"),
    ("missing resume", ["pretrain", "--resume", "{tmp}/nothing"], "nothing"),
    # -- wrong types
    ("num_envs text", ["pretrain", "num_envs=abc", "--run-dir", "{tmp}/r"], "must be an integer"),
    ("lr text", ["pretrain", "ppo.lr=fast", "--run-dir", "{tmp}/r"], "ppo.lr"),
    ("size float", ["pretrain", "population.size=1.5", "--run-dir", "{tmp}/r"], "integer"),
    (
        "hidden not a list",
        ["pretrain", "population.actor_hidden=5", "--run-dir", "{tmp}/r"],
        "actor_hidden",
    ),
    ("section as value", ["pretrain", "ppo=5", "--run-dir", "{tmp}/r"], "ppo"),
    (
        "eval episodes text",
        ["eval", "{run}", "--episodes", "abc", "--out", "{tmp}/e.json"],
        "--episodes",
    ),
    (
        "render episodes zero",
        ["render", "{run}", "--episodes", "0", "--out", "{tmp}/v"],
        "--episodes",
    ),
    (
        "report max steps text",
        ["report", "{run}", "--max-steps", "x", "--out", "{tmp}/r.html"],
        "--max-steps",
    ),
    (
        "export goal text",
        [
            "export",
            "{run}",
            "--format",
            "hdf5",
            "--out",
            "{tmp}/x.hdf5",
            "--task",
            "dense",
            "--goal",
            "a,b",
        ],
        "--goal",
    ),
    (
        "export iterations text",
        ["export", "{run}", "--format", "hdf5", "--out", "{tmp}/x.hdf5", "--iterations", "x:y"],
        "--iterations",
    ),
    ("group option a number", ["pretrain", "env=5", "--run-dir", "{tmp}/r"], "env: "),
    (
        "resume with a group option",
        ["pretrain", "--resume", "{run}", "env=maze"],
        "env='maze' must be a mapping",
    ),
    (
        "empty dataset path",
        ["pretrain", "dataset.path=", "--run-dir", "{tmp}/r"],
        "dataset.path is empty",
    ),
    (
        "eval on a missing gpu",
        ["eval", "{run}", "--device", "cuda:7", "--out", "{tmp}/e.json"],
        "cuda:7",
    ),
    (
        "render on an unknown device",
        ["render", "{run}", "--device", "tpu", "--out", "{tmp}/v"],
        "not a device name",
    ),
    # -- values out of an env's range
    (
        "env time limit zero",
        ["pretrain", "env.options.max_episode_steps=0", "--run-dir", "{tmp}/r"],
        "max_episode_steps >= 1",
    ),
    (
        "unknown task to check",
        ["envs", "check", "nav-maze", "--option", "task=bogus"],
        "unknown task 'bogus'",
    ),
    (
        "eval with an unknown task",
        ["eval", "{run}", "env.options.task=bogus", "--out", "{tmp}/e.json"],
        "unknown task 'bogus'",
    ),
    (
        "more minibatches than rows",
        [
            "pretrain",
            "num_envs=16",
            "num_steps=8",
            "population.size=2",
            "ppo.minibatches=1000",
            "--run-dir",
            "{tmp}/r",
        ],
        "lower ppo.minibatches",
    ),
    # -- wrong shapes
    (
        "goal of 3",
        ["pretrain", "+env.options.goal=[1,2,3]", "--run-dir", "{tmp}/r"],
        "list of 2 numbers",
    ),
    (
        "export goal of 3",
        [
            "export",
            "{run}",
            "--format",
            "hdf5",
            "--out",
            "{tmp}/x.hdf5",
            "--task",
            "dense",
            "--goal",
            "1,2,3",
        ],
        "--goal",
    ),
    (
        "blocks do not split",
        ["pretrain", "num_envs=33", "population.size=2", "--run-dir", "{tmp}/r"],
        "does not split",
    ),
    (
        "kl targets per follower",
        [
            "finetune",
            "--algo",
            "cpo",
            "population.size=4",
            "algo.kl_targets=[0.1,0.2]",
            "--run-dir",
            "{tmp}/r",
        ],
        "kl_targets",
    ),
    # -- NaN and infinite values
    ("lr nan", ["pretrain", "ppo.lr=nan", "--run-dir", "{tmp}/r"], "ppo.lr"),
    ("beta inf", ["pretrain", "objective.beta=inf", "--run-dir", "{tmp}/r"], "objective.beta"),
    ("goal nan", ["pretrain", "+env.options.goal=[.nan,0]", "--run-dir", "{tmp}/r"], "goal"),
    ("validate nan actions", ["dataset", "validate", "{root}/nan_actions.hdf5"], "actions"),
    (
        "export goal nan",
        [
            "export",
            "{run}",
            "--format",
            "hdf5",
            "--out",
            "{tmp}/x.hdf5",
            "--task",
            "dense",
            "--goal",
            "nan,0",
        ],
        "--goal",
    ),
    # -- mismatched checkpoints
    (
        "resume with another size",
        ["pretrain", "--resume", "{run}", "population.size=8"],
        "population.size",
    ),
    ("resume as finetune", ["finetune", "--resume", "{run}"], "myriad pretrain"),
    (
        "init into another env",
        ["finetune", "--init", "{run}", "env=ant", "--run-dir", "{tmp}/r"],
        "task=native",
    ),
    ("eval in another env", ["eval", "{run}", "env.name=maze", "--out", "{tmp}/e.json"], "maze"),
    # -- truncated files
    (
        "init truncated checkpoint",
        ["finetune", "--init", "{root}/truncated.pt", "--run-dir", "{tmp}/r"],
        "not a readable checkpoint",
    ),
    (
        "render truncated checkpoint",
        ["render", "{root}/torn_run", "--out", "{tmp}/v"],
        "checkpoint",
    ),
    (
        "eval truncated checkpoint",
        ["eval", "{root}/torn_run", "--out", "{tmp}/e.json"],
        "checkpoint",
    ),
    (
        "export-policy truncated",
        ["export-policy", "{root}/torn_run", "--format", "torchscript", "--out", "{tmp}/p"],
        "checkpoint",
    ),
    ("resume truncated", ["pretrain", "--resume", "{root}/torn_run"], "no readable checkpoint"),
    ("info truncated hdf5", ["dataset", "info", "{root}/truncated.hdf5"], "not a readable HDF5"),
    (
        "validate truncated hdf5",
        ["dataset", "validate", "{root}/truncated.hdf5"],
        "not a readable HDF5",
    ),
    (
        "verify truncated hdf5",
        ["dataset", "verify", "{root}/truncated.hdf5"],
        "not a readable HDF5",
    ),
    (
        "export truncated hdf5",
        ["export", "{root}/truncated.hdf5", "--format", "zarr", "--out", "{tmp}/x.zarr"],
        "not a readable HDF5",
    ),
    (
        "report truncated summary",
        ["report", "{root}/torn_summary", "--no-render", "--out", "{tmp}/r.html"],
        "summary.json",
    ),
    ("verify truncated summary", ["dataset", "verify", "{root}/torn_summary"], "summary.json"),
    # -- reused folders and outputs
    ("run-dir taken", ["pretrain", "--run-dir", "{run}"], "--resume"),
    (
        "overwrite a foreign folder",
        ["pretrain", "--run-dir", "{root}/foreign_folder", "--overwrite"],
        "no config.yaml",
    ),
    (
        "export onto a foreign file",
        ["export", "{run}", "--format", "hdf5", "--out", "{root}/notes.txt"],
        "notes.txt",
    ),
    (
        "report onto a foreign file",
        ["report", "{run}", "--no-render", "--out", "{root}/notes.txt"],
        "--overwrite",
    ),
    ("eval onto an existing file", ["eval", "{run}", "--out", "{root}/notes.txt"], "--overwrite"),
    (
        "export into the run",
        ["export", "{run}", "--format", "hdf5", "--out", "{run}/summary.json"],
        "summary",
    ),
    # -- bad config files read from disk
    ("config wrong type", ["pretrain", "--resume", "{root}/config_type"], "num_envs='lots'"),
    ("config unknown key", ["pretrain", "--resume", "{root}/config_key"], "no_such_key"),
    (
        "config section a number",
        ["pretrain", "--resume", "{root}/config_section"],
        "must be a mapping",
    ),
    ("config garbage", ["pretrain", "--resume", "{root}/config_garbage"], "config.yaml"),
    ("config a list", ["pretrain", "--resume", "{root}/config_list"], "config.yaml"),
    ("config changed bytes", ["pretrain", "--resume", "{root}/config_flipped"], "digest"),
    (
        "report bad config",
        ["report", "{root}/config_type", "--no-render", "--out", "{tmp}/r.html"],
        "num_envs='lots'",
    ),
    ("verify bad config", ["dataset", "verify", "{root}/config_flipped"], "config.yaml"),
    # -- bad dataset files
    ("info text as hdf5", ["dataset", "info", "{root}/text.hdf5"], "text.hdf5"),
    ("validate text as hdf5", ["dataset", "validate", "{root}/text.hdf5"], "text.hdf5"),
    ("verify text as hdf5", ["dataset", "verify", "{root}/text.hdf5"], "text.hdf5"),
    ("info empty hdf5", ["dataset", "info", "{root}/empty.hdf5"], "empty.hdf5"),
    ("validate empty hdf5", ["dataset", "validate", "{root}/empty.hdf5"], "empty.hdf5"),
    ("verify empty hdf5", ["dataset", "verify", "{root}/empty.hdf5"], "empty.hdf5"),
    (
        "export empty hdf5",
        ["export", "{root}/empty.hdf5", "--format", "zarr", "--out", "{tmp}/x.zarr"],
        "empty.hdf5",
    ),
    ("info missing columns", ["dataset", "info", "{root}/columns.hdf5"], "columns.hdf5"),
    ("validate missing columns", ["dataset", "validate", "{root}/columns.hdf5"], "columns.hdf5"),
    (
        "export missing columns",
        ["export", "{root}/columns.hdf5", "--format", "zarr", "--out", "{tmp}/x.zarr"],
        "columns.hdf5",
    ),
    ("info bad zarr", ["dataset", "info", "{root}/bad.zarr"], "bad.zarr"),
    ("validate bad zarr", ["dataset", "validate", "{root}/bad.zarr"], "bad.zarr"),
    ("verify bad zarr", ["dataset", "verify", "{root}/bad.zarr"], "bad.zarr"),
    (
        "export bad zarr",
        ["export", "{root}/bad.zarr", "--format", "hdf5", "--out", "{tmp}/x.hdf5"],
        "bad.zarr",
    ),
    ("info json file", ["dataset", "info", "{root}/data.json"], "data.json"),
    ("info folder of files", ["dataset", "info", "{root}/foreign_folder"], "foreign_folder"),
    ("verify folder of files", ["dataset", "verify", "{root}/foreign_folder"], "foreign_folder"),
    # -- export
    (
        "export task on a run without goals",
        [
            "export",
            "{root}/columns.hdf5",
            "--format",
            "zarr",
            "--out",
            "{tmp}/x.zarr",
            "--task",
            "dense",
        ],
        "columns.hdf5",
    ),
    (
        "export final population of a file",
        [
            "export",
            "{run}/dataset/transitions.hdf5",
            "--format",
            "hdf5",
            "--out",
            "{tmp}/x.hdf5",
            "--final-population",
            "10",
        ],
        "--final-population",
    ),
    # -- report and render of something that is not a run
    ("report a folder of files", ["report", "{root}/foreign_folder"], "config.yaml"),
    (
        "render a folder of files",
        ["render", "{root}/foreign_folder", "--out", "{tmp}/v"],
        "foreign_folder",
    ),
    ("render a text file", ["render", "{root}/notes.txt", "--out", "{tmp}/v"], "notes.txt"),
    # -- --init with a wrong file
    (
        "init text file",
        ["finetune", "--init", "{root}/notes.txt", "--run-dir", "{tmp}/r"],
        "not a readable checkpoint",
    ),
    (
        "init foreign checkpoint",
        ["finetune", "--init", "{root}/foreign.pt", "--run-dir", "{tmp}/r"],
        "not a myriad checkpoint",
    ),
    (
        "init pickle",
        ["finetune", "--init", "{root}/pickled.pt", "--run-dir", "{tmp}/r"],
        "not a myriad checkpoint",
    ),
    (
        "init a dataset",
        ["finetune", "--init", "{run}/dataset/transitions.hdf5", "--run-dir", "{tmp}/r"],
        "checkpoint",
    ),
    (
        "init a folder of files",
        ["finetune", "--init", "{root}/foreign_folder", "--run-dir", "{tmp}/r"],
        "foreign_folder",
    ),
    (
        "init a missing path",
        ["finetune", "--init", "{tmp}/nothing", "--run-dir", "{tmp}/r"],
        "nothing",
    ),
]


@pytest.fixture(scope="module")
def corpus(tiny_pretrain, tmp_path_factory) -> Path:
    """Broken copies of the tiny run's files, and foreign files, in one folder."""
    root = tmp_path_factory.mktemp("corpus")
    run = tiny_pretrain.path
    dataset = run / "dataset" / "transitions.hdf5"
    (root / "truncated.hdf5").write_bytes(dataset.read_bytes()[: dataset.stat().st_size // 2])
    checkpoint = sorted((run / "checkpoints").glob("*.pt"))[-1]
    (root / "truncated.pt").write_bytes(checkpoint.read_bytes()[:1000])
    (root / "notes.txt").write_text("not a checkpoint\n")
    (root / "text.hdf5").write_text("not an HDF5 file\n")
    (root / "data.json").write_text("{}\n")
    torch.save({"weights": torch.zeros(3)}, root / "foreign.pt")
    torch.save({"config": {}, "state": {}, "opaque": Path("x")}, root / "pickled.pt")
    shutil.copy(dataset, root / "nan_actions.hdf5")
    with h5py.File(root / "nan_actions.hdf5", "r+") as f:
        f["actions"][3] = np.nan  # rewritten with its checksum: the values are what is wrong
    with h5py.File(root / "empty.hdf5", "w"):
        pass
    with h5py.File(root / "columns.hdf5", "w") as f:
        f["observations"] = np.zeros((4, 2), np.float32)
    bad_zarr = root / "bad.zarr"
    bad_zarr.mkdir()
    (bad_zarr / "zarr.json").write_text("{not json")
    foreign = root / "foreign_folder"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious\n")

    def broken(name: str) -> Path:
        copy = root / name
        shutil.copytree(run, copy)
        return copy

    torn = broken("torn_run")
    for ckpt in (torn / "checkpoints").glob("*.pt"):
        ckpt.write_bytes(ckpt.read_bytes()[:1000])
    summary = broken("torn_summary") / "summary.json"
    summary.write_text(summary.read_text()[:100])
    body = (run / "config.yaml").read_text().partition("\n")[2]  # hand-edited: no digest line
    lines = body.splitlines()
    start = lines.index("ppo:")
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" "))
    edits = {
        "config_type": body.replace("num_envs: 64", 'num_envs: "lots"'),
        "config_key": body + "no_such_key: 1\n",
        "config_section": "\n".join([*lines[:start], "ppo: 5", *lines[end:]]) + "\n",
        "config_garbage": "env: [unclosed\n  : :\n",
        "config_list": "- 1\n- 2\n",
    }
    for name, text in edits.items():
        (broken(name) / "config.yaml").write_text(text)
    flipped = broken("config_flipped") / "config.yaml"
    flipped.write_text(flipped.read_text().replace("num_envs: 64", "num_envs: 32"))
    return root


@pytest.mark.parametrize(
    ("args", "words"),
    [
        pytest.param(
            args,
            words,
            id=name,
            marks=[pytest.mark.xfail(reason=NOT_COVERED[name], strict=True)]
            if name in NOT_COVERED
            else [],
        )
        for name, args, words in CASES
    ],
)
def test_each_bad_input_ends_in_one_line_naming_the_fix(
    tiny_pretrain, corpus, tmp_path, capsys, monkeypatch, args, words
):
    monkeypatch.chdir(tmp_path)  # where default outputs (runs/, ...) would appear
    places = {"run": str(tiny_pretrain.path), "root": str(corpus), "tmp": str(tmp_path)}
    argv = [a.format(**places) for a in args]
    before = snapshot(tiny_pretrain.path), snapshot(corpus)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert code != 0, (argv, out, err)
    assert GENERIC not in out + err and "Traceback" not in out + err, (argv, out, err)
    if argv[:2] in (["dataset", "validate"], ["dataset", "verify"]):
        # These print a report (stdout, status 1): the failed check, with what is wrong.
        fails = [line for line in out.splitlines() if "FAIL" in line]
        assert code == 1 and not err and fails, (argv, out, err)
        assert words.format(**places) in fails[0], (argv, fails)
        # ...in words, not as an exception's class name ("FAIL readable: JSONDecodeError: ...").
        assert not re.search(r"FAIL[^:]*: [A-Z]\w*(Error|Exception)\b", fails[0]), fails
    else:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("myriad: error: "), (argv, err)
        assert words.format(**places) in lines[0], (argv, lines[0])
    assert (snapshot(tiny_pretrain.path), snapshot(corpus)) == before, argv
    assert not any(tmp_path.iterdir()), (argv, list(tmp_path.iterdir()))


#: Failed writes, each in a child process: ``limit`` bytes per file (RLIMIT_FSIZE: what a full
#: disk looks like to the writer) or, with ``None``, an output folder it may not write. The
#: message must name the file whose write failed and the command to run next.
WRITE_FAILURES: list[tuple[str, int | None, list[str]]] = [
    ("export zarr, full disk", 20_000, ["export", "{run}", "--format", "zarr", "--out", "{out}"]),
    (
        "export minari, full disk",
        20_000,
        ["export", "{run}", "--format", "minari", "--out", "{out}", "--dataset-id", "test/run-v0"],
    ),
    ("report, full disk", 20_000, ["report", "{reported}", "--no-render", "--out", "{out}"]),
    ("render, full disk", 20_000, ["render", "{run}", "--format", "gif", "--out", "{out}"]),
    ("eval, full disk", 100, ["eval", "{run}", "--episodes", "1", "--out", "{out}"]),
    (
        "export-policy, full disk",
        100,
        ["export-policy", "{run}", "--format", "torchscript", "--out", "{out}"],
    ),
    (
        "export-policy onnx, full disk",
        100,
        ["export-policy", "{run}", "--format", "onnx", "--out", "{out}"],
    ),
    (
        "finetune, full disk",
        60_000,
        [
            "finetune",
            "--init",
            "{run}",
            "num_envs=16",
            "iterations=2",
            "init.episodes=1",
            "progress=false",
            "--run-dir",
            "{out}",
        ],
    ),
    ("export hdf5, permission", None, ["export", "{run}", "--format", "hdf5", "--out", "{out}"]),
    ("report, permission", None, ["report", "{reported}", "--no-render", "--out", "{out}"]),
    ("render, permission", None, ["render", "{run}", "--format", "gif", "--out", "{out}"]),
    ("eval, permission", None, ["eval", "{run}", "--episodes", "1", "--out", "{out}"]),
    (
        "export-policy, permission",
        None,
        ["export-policy", "{run}", "--format", "torchscript", "--out", "{out}"],
    ),
]


def _limited(limit: int | None):
    """The child's set-up: a write limit, or (``None``) file permissions honoured even by root
    (CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH dropped from its bounding set)."""

    def setup() -> None:
        if limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
            return
        libc = ctypes.CDLL(None, use_errno=True)
        for capability in (1, 2):
            if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")

    return setup


@pytest.fixture(scope="module")
def reported_run(tiny_pretrain, tmp_path_factory) -> Path:
    """A copy of the tiny run that ``report`` has run on once: its behaviour plots exist, so a
    later ``report --out X`` writes nothing but ``X``."""
    run = tiny_pretrain.copy(tmp_path_factory.mktemp("reported") / "run")
    assert main(["report", str(run), "--no-render"]) == 0
    return run


@pytest.mark.parametrize(
    ("limit", "args"), [c[1:] for c in WRITE_FAILURES], ids=[c[0] for c in WRITE_FAILURES]
)
def test_a_failed_write_names_the_file_and_the_command(
    tiny_pretrain, reported_run, tmp_path, limit, args
):
    if "onnx" in args:
        pytest.importorskip("onnxscript")
    folder = tmp_path / "out"
    folder.mkdir()
    if limit is None:  # a folder of another user, not writable by this one
        if os.geteuid() == 0:
            os.chown(folder, 65534, 65534)
        folder.chmod(0o555)
    out = folder / "target"
    argv = [a.format(run=tiny_pretrain.path, reported=reported_run, out=out) for a in args]
    before = snapshot(tiny_pretrain.path), snapshot(reported_run)
    child = subprocess.run(
        [sys.executable, "-m", "myriad.cli", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limited(limit),
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"},
    )
    folder.chmod(0o755)
    lines = child.stderr.strip().splitlines()
    assert child.returncode != 0 and len(lines) == 1, (argv, child.stderr[-3000:])
    assert lines[0].startswith("myriad: error: ") and GENERIC not in lines[0], lines
    assert str(out) in lines[0], lines  # the file whose write failed, or the folder of it
    assert ("File too large" in lines[0]) == (limit is not None), lines
    assert ("ermission denied" in lines[0]) == (limit is None), lines
    assert f"then run: myriad {argv[0]}" in lines[0], lines  # the command to run next
    assert (snapshot(tiny_pretrain.path), snapshot(reported_run)) == before
