"""One vocabulary across shoal's commands (issue 49): one flag per meaning, each ecosystem's spelling
an alias of it (Slurm's ``--nodes``, torchrun's ``--nproc-per-node``), and one help style. Every
subcommand's parser is walked, ``shoal launch``'s forms and ``shoal run``'s torch-free parser
included: a second name for a meaning that is not an alias of the first fails here."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from shoal.cli.launch import _FORMS
from shoal.cli.main import build_parser
from shoal.cli.parser import HELP_WIDTH, ArgumentParser
from shoal.cli.run.args import build_parser as run_parser
from shoal.console import help_text

MEANINGS = {
    # meaning: (the canonical flag, every spelling accepted, the dests that hold it)
    "nodes in the job": ("--nnodes", {"--nnodes", "--nodes"}, {"nnodes", "nodes"}),
    "processes per node": ("--nproc", {"--nproc", "--nproc-per-node", "--nproc_per_node"}, {"nproc", "nproc_per_node"}),
    "rendezvous backend": ("--rdzv-backend", {"--rdzv-backend", "--rdzv_backend", "--rdzv"}, {"rdzv_backend"}),
    "rendezvous endpoint": ("--rdzv-endpoint", {"--rdzv-endpoint", "--rdzv_endpoint"}, {"rdzv_endpoint"}),
    "rendezvous id": ("--rdzv-id", {"--rdzv-id", "--rdzv_id"}, {"rdzv_id"}),
    "this node's rank": ("--node-rank", {"--node-rank", "--node_rank"}, {"node_rank"}),
    "the master's address": ("--master-addr", {"--master-addr", "--master_addr"}, {"master_addr"}),
    "the master's port": ("--master-port", {"--master-port", "--master_port"}, {"master_port"}),
    "this node's address": ("--local-addr", {"--local-addr", "--local_addr"}, {"local_addr"}),
    "restarts after a failure": ("--max-restarts", {"--max-restarts", "--max_restarts"}, {"max_restarts"}),
    "how workers start": ("--start-method", {"--start-method", "--start_method"}, {"start_method"}),
    "GPUs per node": ("--gpus-per-node", {"--gpus-per-node", "-g"}, {"gpus_per_node"}),
    "how long nodes wait for each other": ("--join-timeout", {"--join-timeout"}, {"join_timeout"}),
    "hang timeout": ("--hang-timeout", {"--hang-timeout"}, {"hang_timeout"}),
}


def parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every parser a user reaches: ``shoal``'s subcommands (and theirs), ``shoal run``'s own, each
    ``shoal launch`` form's."""

    def walk(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
        parser.format_help()  # fills a benchmark's flags, which load on first use
        if parser.prog not in ("shoal run", "shoal launch"):  # stand-ins: the real ones follow
            yield parser.prog, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in dict.fromkeys(action.choices.values()):
                    yield from walk(sub)

    yield from walk(build_parser())
    yield "shoal run", run_parser(ArgumentParser)
    for make, _ in _FORMS.values():
        parser = make()
        yield parser.prog, parser


PARSERS = dict(parsers())


def test_every_command_is_walked():
    expected = {"shoal train", "shoal run", "shoal env", "shoal doctor", "shoal status", "shoal launch slurm"}
    assert expected | {"shoal launch", "shoal launch k8s", "shoal bench scaling", "shoal demo all-reduce"} <= set(
        PARSERS
    )


@pytest.mark.parametrize("prog", sorted(PARSERS))
def test_one_flag_per_meaning(prog):
    """In each command, every spelling of a meaning names one flag, and that flag has the canonical spelling."""
    actions = PARSERS[prog]._actions
    for meaning, (canonical, spellings, dests) in MEANINGS.items():
        named = [a for a in actions if set(a.option_strings) & spellings or (a.option_strings and a.dest in dests)]
        assert len(named) <= 1, f"{prog}: {meaning} has two flags: {[a.option_strings for a in named]}"
        if named:
            flags = named[0].option_strings
            assert canonical in flags, f"{prog}: {meaning} is {flags}, without {canonical}"
            assert flags[0] == canonical or flags[0].startswith("-") and len(flags[0]) == 2, (prog, flags)
            assert set(flags) <= spellings | {"-g"}, (
                f"{prog}: {meaning} has a spelling the table does not know: {flags}"
            )


def test_a_spelling_means_one_thing_everywhere():
    """No flag of one command is spelled as another meaning's flag in another command."""
    owner = {spelling: meaning for meaning, (_, spellings, _) in MEANINGS.items() for spelling in spellings}
    for prog, parser in PARSERS.items():
        for action in parser._actions:
            meanings = {owner[s] for s in action.option_strings if s in owner}
            assert len(meanings) <= 1, f"{prog}: {action.option_strings} mixes {meanings}"


@pytest.mark.parametrize("prog", sorted(PARSERS))
def test_one_help_style(prog, monkeypatch):
    """A flag's help starts lower-case (unless with an acronym or a name) and has no closing full
    stop, as argparse's own ("show this help message and exit"); no line of any ``--help`` is wider
    than HELP_WIDTH columns."""
    monkeypatch.setenv("COLUMNS", "300")
    parser = PARSERS[prog]
    for action in parser._actions:
        text = action.help
        if not text or text == argparse.SUPPRESS or not action.option_strings:
            continue
        assert " ".join(text.split()) == help_text(text), f"{prog} {action.option_strings[0]}: {text!r}"
    wide = [line for line in parser.format_help().splitlines() if len(line) > HELP_WIDTH]
    assert not wide, f"{prog} --help: lines over {HELP_WIDTH} columns: {wide}"


def test_watchdog_flags_only_where_the_watchdog_acts():
    """``shoal env`` and ``shoal doctor`` start no watched job: no --hang-timeout, no --on-hang."""
    for prog in ("shoal env", "shoal doctor"):
        flags = {s for a in PARSERS[prog]._actions for s in a.option_strings}
        assert not flags & {"--hang-timeout", "--on-hang"}, prog
    for prog in ("shoal train", "shoal run"):
        flags = {s for a in PARSERS[prog]._actions for s in a.option_strings}
        assert {"--hang-timeout", "--on-hang"} <= flags, prog


@pytest.mark.parametrize(
    "form, canonical, alias",
    [
        (["slurm"], ["--nnodes", "2", "--nproc", "4"], ["--nodes", "2", "--nproc-per-node", "4"]),
        (["k8s", "--image", "img:1"], ["--nnodes", "2", "--nproc", "2"], ["--nodes", "2", "--nproc-per-node", "2"]),
        (["manual", "--hosts", "a:2,b:2"], ["--rdzv-backend", "c10d"], ["--rdzv", "c10d"]),
    ],
)
def test_an_alias_renders_what_the_canonical_flag_does(form, canonical, alias, capsys, tmp_path, monkeypatch):
    """Slurm's and torchrun's spellings (and launch's old --rdzv) are the same flag: the same render."""
    from shoal.cli.launch import main_raw

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    rendered = []
    for flags in (canonical, alias):
        assert main_raw([*form, *flags, "--dry-run", "--", "train.py"]) == 0
        rendered.append(capsys.readouterr().out)
    assert rendered[0] == rendered[1] and rendered[0]


def test_train_takes_each_spelling_of_a_launch_flag():
    parser = PARSERS["shoal train"]
    assert vars(parser.parse_args(["--nproc-per-node", "2", "--nodes", "1"])) == vars(
        parser.parse_args(["--nproc", "2", "--nnodes", "1"])
    )
