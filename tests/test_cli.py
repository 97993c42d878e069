"""The `xtrain` entry point: every subcommand has a --help that explains it."""

import subprocess
import sys

import pytest

from xtrain_lessons.cli import main


def test_top_level_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit) as exc:
        main.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name, _ in main.SUBCOMMANDS:
        assert name in out


@pytest.mark.parametrize("name", [name for name, _ in main.SUBCOMMANDS])
def test_every_subcommand_has_help(name, capsys):
    with pytest.raises(SystemExit) as exc:
        main.main([name, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--device" in out and len(out.splitlines()) >= 3


def test_no_command_prints_help_and_fails(capsys):
    assert main.main([]) == 2
    assert "usage" in capsys.readouterr().out


def test_console_script_runs():
    res = subprocess.run([sys.executable, "-m", "xtrain_lessons.cli.main", "--version"],
                         capture_output=True, text=True)
    assert res.returncode == 0 and "xtrain-lessons" in res.stdout
