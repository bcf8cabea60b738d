"""The CLI's basics: option defaults from SPECLLM_... environment variables, `--version`, `doctor`.

Environment variables are attached in one place, to the Click command Typer builds, rather than
option by option: every option of every command (those added later too) reads
SPECLLM_<LONG NAME> (--ctx-size: SPECLLM_CTX_SIZE), and one name means the same setting in every
command (SPECLLM_THREADS sets --threads of run, chat, bench and any other command that has it).
Click's own auto_envvar_prefix would instead give each command its own names
(SPECLLM_RUN_THREADS, SPECLLM_CHAT_THREADS, ...). A flag given on the command line wins over
its variable, and over a variable it cannot go with (SPECLLM_PAIR set, `run --target T` runs T);
a bad value in a variable is refused with the same one line as on the command line, naming the
variable.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated

import typer
from typer.main import get_command

from specllm.cli.options import a_value
from specllm.llama.memory import SKIP_VARIABLE

ENV_PREFIX = "SPECLLM_"
# Variables specllm reads for something else: no option may take their names.
RESERVED = frozenset({"SPECLLM_CACHE", "SPECLLM_LMSTUDIO_HOME", SKIP_VARIABLE})
# Options that are not read from the environment, and why.
NOT_FROM_ENV = {
    # a flag in run, doctor and models, but bench's output file: one variable cannot be both
    "--json",
}
# Options that cannot go together (by parameter name), and where given, whether their values
# clash (else any two set do). Where one side comes from a variable and the other from the
# command line, the variable gives way: an exported default must not turn a flag the user typed
# into an error.
CONFLICTS: tuple[tuple[set[str], set[str]] | tuple[set[str], set[str], Callable[[dict], bool]], ...] = (
    ({"pair"}, {"target", "draft"}),
    ({"system"}, {"chat_template"}),  # --raw
    ({"think"}, {"chat_template"}),
    ({"reasoning_effort"}, {"chat_template"}),
    ({"suffix"}, {"system", "think", "reasoning_effort"}),  # a fill in the middle has no chat template
    ({"think"}, {"reasoning_effort"}, lambda p: p["think"] is True and p["reasoning_effort"] == "none"),
    ({"drafts_for"}, {"pair", "target", "draft", "drafter"}),
)


def build_command(app: typer.Typer):
    """The Click command of the Typer app, every command's options reading their variables."""
    command = get_command(app)
    add_env_defaults(command)
    return command


def add_env_defaults(group) -> None:
    """Give each option of each subcommand (at any depth) its SPECLLM_ variable, shown in --help.
    The group's own options (--version, completion) are not settings and get none."""
    for command in getattr(group, "commands", {}).values():
        for param in command.params:
            name = env_name(param)
            if name is not None:
                param.envvar = name
                param.show_envvar = True
        if command.params:
            command.invoke = _flags_first(command.invoke)
        add_env_defaults(command)


def _flags_first(invoke):
    def invoke_with_flags_first(ctx):
        give_way_to_flags(ctx)
        check_variables(ctx)
        return invoke(ctx)

    return invoke_with_flags_first


def give_way_to_flags(ctx) -> None:
    """Reset to its default each option set by its variable that conflicts with an option given
    on the command line."""
    params = {param.name: param for param in ctx.command.params}

    def source(name: str) -> str | None:
        if name not in params or ctx.params.get(name) == params[name].default:
            return None  # not set: no conflict
        found = ctx.get_parameter_source(name)
        return found.name if found is not None else None

    for one, other, *clash in CONFLICTS:
        if clash and not (all(name in ctx.params for name in one | other) and clash[0](ctx.params)):
            continue  # values that do not clash, or a command without both options
        for mine, theirs in ((one, other), (other, one)):
            if any(source(name) == "COMMANDLINE" for name in theirs):
                for name in mine:
                    if source(name) == "ENVIRONMENT":
                        ctx.params[name] = params[name].default


def check_variables(ctx) -> None:
    """Check each value read from a variable on its own, before the command checks them all
    together: its error then says which variable set it. The command's own message names only
    the setting ("top-p must be in [0, 1]"), and a variable exported long ago is easily forgotten."""
    from specllm.cli.options import check_alone
    from specllm.errors import SpecllmError

    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name)
        if param.name in ctx.params and source is not None and source.name == "ENVIRONMENT":
            try:
                check_alone(param.name, ctx.params[param.name], ctx.command.name, ctx.params)
            except SpecllmError as error:
                raise SpecllmError(f"{error} (set by {param.envvar})") from None


def env_name(param) -> str | None:
    """SPECLLM_ and the option's first long name, upper case, dashes as underscores; None for an
    argument (`rm PAIR` must never come from the environment), an option without a long name, or
    one left out on purpose."""
    if param.param_type_name != "option":
        return None
    long = next((opt for opt in param.opts if opt.startswith("--")), None)
    if long is None or long in NOT_FROM_ENV:
        return None
    name = ENV_PREFIX + long[2:].upper().replace("-", "_")
    return None if name in RESERVED else name


# --- specllm --version -------------------------------------------------------------------------


def version_lines() -> list[str]:
    from specllm._version import __version__
    from specllm.llama.system import system_info

    info = system_info()
    return [
        f"specllm {__version__}",
        f"llama-cpp-python {info['llama_cpp_python']}",
        f"llama.cpp {info['llama_cpp']}",
        info["system_info"],
    ]


def _show_version(value: bool) -> None:
    if value:
        print("\n".join(version_lines()))
        raise typer.Exit()


def main_options(
    version: Annotated[
        bool | None,
        typer.Option(
            "--version",
            callback=_show_version,
            is_eager=True,
            help="Show the versions of specllm and llama.cpp, and exit.",
        ),
    ] = None,
) -> None:
    """Fast local LLM inference on llama.cpp GGUF models through speculative decoding."""


# --- specllm doctor ----------------------------------------------------------------------------


def doctor_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    rpc: Annotated[
        str | None,
        typer.Option(parser=a_value, help="Also check these llama.cpp rpc-servers, HOST:PORT,..."),
    ] = None,
) -> None:
    """Show the versions, the llama.cpp build, GPU offload and RPC support and devices (and, with
    --rpc, whether each server answers and how much memory it offers)."""
    from specllm._version import __version__
    from specllm.engine.sampling import implementation
    from specllm.llama.options import parse_rpc_servers
    from specllm.llama.rpc import rpc_server_memory
    from specllm.llama.system import system_info

    servers = parse_rpc_servers(rpc or ())
    info = {"specllm": __version__, "sampler": implementation(), **system_info()}
    # An unusable server is the command's one-line error.
    memory = {server: rpc_server_memory(server) for server in servers}
    if as_json:
        info["rpc_servers"] = {
            server: [{"device": name, "free": free, "total": total} for name, free, total in devices]
            for server, devices in memory.items()
        }
        print(json.dumps(info))
        return
    for key, value in info.items():
        if isinstance(value, list):
            value = ", ".join(value) or "none"
        print(f"{key}: {value}")
    for server, devices in memory.items():
        listed = ", ".join(
            f"{name} {free / 2**20:.0f} MiB free of {total / 2**20:.0f} MiB" for name, free, total in devices
        )
        print(f"rpc server {server}: answers · {listed}")
