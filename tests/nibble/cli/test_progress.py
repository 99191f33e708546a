"""Progress of long CLI work: a bar with an ETA on a terminal, plain lines with an ETA elsewhere."""

import io
import re
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from nibble.cli.progress import Progress

NIBBLE = str(Path(sys.executable).with_name("nibble"))


def test_off_a_terminal_progress_is_a_plain_line_with_the_time_left():
    out = io.StringIO()
    with Progress("work", 4, unit="steps", console=Console(file=out, width=200), every_seconds=0) as bar:
        bar.print("a line of output")
        bar.advance(note="first")
        bar.advance(note="second")
        bar.advance(2)
    lines = out.getvalue().splitlines()
    assert lines[0] == "a line of output"
    assert re.fullmatch(r"work: 1/4 steps \(25%\), \d+\.\d s, ETA \?  first", lines[1]), lines  # no rate yet
    assert re.fullmatch(r"work: 2/4 steps \(50%\), \d+\.\d s, ETA \d+\.\d s  second", lines[2]), lines
    assert re.fullmatch(r"work: 4/4 steps \(100%\), \d+\.\d s, ETA 0\.0 s  second", lines[3]), lines
    assert len(lines) == 4  # the end is not said twice


def test_on_a_terminal_progress_is_a_bar_with_an_eta():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160, color_system=None)
    with Progress("work", 10, unit="steps", console=console) as bar:
        bar.advance(3, note="loss 0.5")
    text = out.getvalue()
    assert "work" in text and "30%" in text and "3/10 steps" in text and "ETA" in text and "loss 0.5" in text


def test_quant_error_reports_progress_on_stderr_and_keeps_stdout_for_the_report():
    result = subprocess.run([NIBBLE, "quant-error", "--rows", "64", "--cols", "256", "--json"], capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.lstrip().startswith("[")
    assert re.search(r"quantising: 0\.0328/0\.0328 M elements \(100%\), .* ETA 0\.0 s", result.stderr), result.stderr
