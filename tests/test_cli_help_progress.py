"""``zephon --help`` reads as help (what the command is, then one line per command), and
``zephon convert`` shows its progress: a bar with the current shard's rows on a
terminal, one plain line per converted shard anywhere else."""

from __future__ import annotations

import json

from cli_helpers import terminal_output
from click.testing import CliRunner

from zephon_core.cli.commands import cli
from zephon_core.progress import progress_bar
from zephon_core.sources.convert import jsonl_to_parquet


def test_help_says_what_zephon_is_and_lists_each_command_on_one_line():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    text = result.output
    first = text.split("\n\n")[1].strip()  # after "Usage: ..."
    assert first.startswith("Zephon's command line:"), first
    assert "``" not in text and "zephon --help" not in text  # not a docstring about itself
    listing = text.split("Commands:\n")[1].splitlines()
    assert sorted(line.split()[0] for line in listing) == sorted(cli.commands)
    assert not [line for line in listing if line.endswith("...")]  # none cut short


def _shards(d, n: int, rows: int) -> list[str]:
    d.mkdir()
    for s in range(n):
        lines = [json.dumps({"text": f"doc {s}.{i}"}) for i in range(rows)]
        (d / f"part-{s}.jsonl").write_text("\n".join(lines) + "\n")
    return sorted(str(p) for p in d.iterdir())


def test_convert_prints_a_line_per_shard_into_a_pipe(tmp_path):
    inputs = _shards(tmp_path / "raw", 3, 5)
    args = ["convert", *inputs, "--out", str(tmp_path / "pq"), "--row-group-rows", "2"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        f"converting to Parquet: {i}/3 shards (part-{i - 1}.jsonl: 5 rows)" for i in (1, 2, 3)
    ]
    assert "wrote 3 Parquet shard(s)" in result.stdout


def test_convert_on_a_terminal_shows_a_bar_with_the_rows_of_the_shard(tmp_path):
    inputs = _shards(tmp_path / "raw", 2, 5)
    text = terminal_output(
        lambda: jsonl_to_parquet(inputs, str(tmp_path / "pq"), row_group_rows=2, progress=True)
    )
    assert "\r" in text  # redrawn in place: a bar, not lines
    assert "converting to Parquet" in text and "2/2" in text
    assert "part-0.jsonl: 4 rows" in text and "part-1.jsonl: 5 rows" in text


def test_progress_lines_into_a_pipe_are_about_a_hundred_for_many_items(capsys):
    bar = progress_bar(250, "indexing Parquet footers", "shard", show=True)
    for _ in range(250):
        bar.update(1)
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 125  # every 2nd of 250
    assert lines[0] == "indexing Parquet footers: 2/250 shards"
    assert lines[-1] == "indexing Parquet footers: 250/250 shards"
