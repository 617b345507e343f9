"""Completion as bash, zsh and fish run it: each shell loads the script
``cosmicac --show-completion`` prints for it and completes command lines whose
values come from an in-process app-node (a real ``cosmicac`` process per TAB).

- bash: the function ``complete -p cosmicac`` names, called as bash calls it on a
  TAB (``COMP_WORDS``, ``COMP_CWORD``, ``COMP_LINE``), ``COMPREPLY`` printed;
- zsh: an interactive zsh in a pseudo-terminal (``zpty``) with ``compinit``,
  the line typed and TAB pressed, every candidate the completion system adds
  captured by a ``compadd`` wrapper (with its description);
- fish: ``complete -C LINE``, fish's own completion of a command line.

A job named to break out of the shells' quoting completes without running anything.
zsh and fish are installed by ``.ci/run`` (Debian's packages); a dev box without one
skips its test, saying so, unless ``CAC_SHELLS_REQUIRED`` is set (CI).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from .support import ServedOrk

pytestmark = pytest.mark.slow

IMAGE = "docker://registry.local/jobs/app:1"
REPO = Path(__file__).resolve().parents[2]
#: A job name written to break out of bash's, zsh's and fish's quoting.
HOSTILE = "x\"'`touch pwned-1`$(touch pwned-2)\\\"; touch pwned-3; echo ["


def _shell(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CAC_SHELLS_REQUIRED"):
            raise RuntimeError(f"CAC_SHELLS_REQUIRED is set but {name} is not installed "
                               f"(bash .ci/run deps installs it)")
        pytest.skip(f"{name} is not installed (apt-get install {name}; .ci/run does)")
    return found


@dataclass
class World:
    served: ServedOrk
    env: dict[str, str]
    home: Path
    llm: str  # an inference job serving "chatty"
    box: str  # a container job named "my box"
    hostile: str  # a container job named HOSTILE


@pytest.fixture
async def world(served_ork: ServedOrk, tmp_path: Path) -> World:
    served = served_ork
    with trio.fail_after(120):
        await served.login()
        jobs = []
        for args in (["--name", "llm", "--type", "inference", "--runtime", "local",
                      "--model", "demo", "--served-name", "chatty"],
                     ["--name", "my box", "--type", "container"],
                     ["--name", HOSTILE, "--type", "container"]):
            created = await served.cli("jobs", "create", "--image", IMAGE, *args)
            assert created.returncode == 0, created.stderr
            jobs.append(created.stdout.decode().strip())
        added = await served.cli("models", "add", "meta-llama/Llama-3.1-8B", "--runtime",
                                 "vllm")
        assert added.returncode == 0, added.stderr
    # `cosmicac` on the PATH, as installed: a script of this interpreter.
    bin_dir, home = tmp_path / "bin", tmp_path / "home"
    bin_dir.mkdir()
    home.mkdir()
    script = bin_dir / "cosmicac"
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom cli.main import main\n"
                      f"sys.exit(main())\n")
    script.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home),
           "TERM": "xterm", "LANG": "C.UTF-8", "COSMICAC_CONFIG_DIR": str(served.config),
           "COSMICAC_SERVER": served.server, "NO_COLOR": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [
               os.environ.get("PYTHONPATH"), str(REPO)]))}
    return World(served, env, home, *jobs)


#: (line typed, then TAB) -> what the candidates must be.
def _expected(world: World) -> dict[str, set[str]]:
    return {
        "cosmicac jo": {"jobs"},
        "cosmicac jobs get ": {world.llm, world.box, world.hostile},
        f"cosmicac jobs get {world.box[:-3]}": {world.box},
        "cosmicac shell ": {world.box, world.hostile},
        "cosmicac inference chat --model ": {"chatty"},
        "cosmicac jobs list --team ": {"core"},
        "cosmicac models remove meta": {"meta-llama/Llama-3.1-8B"},
        "cosmicac jobs list -o ": {"table", "wide", "json", "yaml", "name"},
    }


async def _run(world: World, argv: list[str], cwd: Path) -> str:
    with trio.fail_after(240):
        done = await trio.run_process(argv, env=world.env, cwd=cwd, capture_stdout=True,
                                      capture_stderr=True, check=False,
                                      stdin=subprocess.DEVNULL)
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done.stdout.decode()


def _check(world: World, got: dict[str, dict[str, str]], *, described: bool) -> None:
    for line, values in _expected(world).items():
        assert set(got[line]) == values, line
    if described:  # zsh and fish show each job's name beside its id
        jobs = got["cosmicac jobs get "]
        assert "llm" in jobs[world.llm] and "my box" in jobs[world.box]
        assert "inference" in jobs[world.llm]
    assert not list(world.home.glob("pwned*")) and not list(Path.cwd().glob("pwned*"))


# -- bash -------------------------------------------------------------------------

_BASH = r"""
set -u
source <(cosmicac --show-completion)
spec=$(complete -p cosmicac) || exit 3
fn=${spec##*-F }; fn=${fn%% *}
tab() {  # a command line's words, the last being completed, as bash passes them
    COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 ))
    COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}; COMPREPLY=()
    "$fn" cosmicac "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
    printf '%s\n' "${COMPREPLY[@]}"
    echo '<<<END>>>'
}
"""


async def test_bash_completes_commands_jobs_teams_models_and_served_names(
        world: World, tmp_path: Path) -> None:
    bash = _shell("bash")
    lines = list(_expected(world))
    script = _BASH + "".join(
        "tab " + " ".join(_bash_quote(w) for w in _words(line)) + "\n" for line in lines)
    out = await _run(world, [bash, "--norc", "--noprofile", "-c", script], tmp_path)
    answers = out.split("<<<END>>>\n")
    assert len(answers) == len(lines) + 1, out
    got = {line: {value: "" for value in answer.splitlines() if value}
           for line, answer in zip(lines, answers, strict=False)}
    _check(world, got, described=False)


def _words(line: str) -> list[str]:
    words = line.split(" ")
    return words  # "a b " -> ["a", "b", ""]: the empty word being completed


def _bash_quote(word: str) -> str:
    return "'" + word.replace("'", "'\\''") + "'"


# -- zsh --------------------------------------------------------------------------

#: Run by ``zsh -f``: an interactive zsh in a pseudo-terminal (zpty), with compinit and
#: the script ``cosmicac --show-completion`` prints; types $1 and TAB, prints each
#: candidate the completion system adds as <<<value|description>>>.
_ZSH = r"""
zmodload zsh/zpty || exit 3
zpty z zsh -f -i
local line
zpty -w z 'PROMPT= RPROMPT='
zpty -w z 'autoload -Uz compinit && compinit -u -d "$HOME/.zcompdump"'
zpty -w z 'source <(cosmicac --show-completion)'
zpty -w z 'bindkey "^I" complete-word'
zpty -w z 'zstyle ":completion:*" list-grouped false; zstyle ":completion:*" insert-tab false'
zpty -w z '_begin () { print -r -- "<<<BEGIN>>>" }; _end () { print -r -- "<<<END>>>" }'
zpty -w z 'compprefuncs=( _begin ); comppostfuncs=( _end exit )'
zpty -w z 'compadd () {
  if [[ ${@[1,(i)(-|--)]} == *-(O|A|D)\ * ]]; then builtin compadd "$@"; return $?; fi
  typeset -a __hits __dscr __tmp
  if (( $@[(I)-d] )); then
    __tmp=${@[$[${@[(i)-d]}+1]]}
    if [[ $__tmp == \(* ]]; then eval "__dscr=$__tmp"; else __dscr=( "${(@P)__tmp}" ); fi
  fi
  builtin compadd -A __hits -D __dscr "$@"
  local i
  for i in {1..$#__hits}; do print -r -- "<<<${__hits[$i]}|${__dscr[$i]}>>>"; done
}'
zpty -w z 'print -r -- READY""'
while zpty -r z line; do [[ $line == *READY* ]] && break; done
zpty -w -n z "$1"$'\t'
integer on=0
while zpty -r z line; do
  [[ $line == *'<<<BEGIN>>>'* ]] && { on=1; continue }
  [[ $line == *'<<<END>>>'* ]] && break
  (( on )) && print -r -- "${line%$'\r'}"
done
zpty -d z
"""


async def test_zsh_completes_commands_jobs_teams_models_and_served_names(
        world: World, tmp_path: Path) -> None:
    zsh = _shell("zsh")
    capture = tmp_path / "capture.zsh"
    capture.write_text(_ZSH)
    got: dict[str, dict[str, str]] = {}
    for line in _expected(world):
        out = await _run(world, [zsh, "-f", str(capture), line], tmp_path)
        got[line] = {}
        for row in out.splitlines():
            if row.startswith("<<<") and row.endswith(">>>"):
                value, _, description = row[3:-3].partition("|")
                # zsh's display string: "value  -- description"
                got[line][value] = description.partition(" -- ")[2]
    _check(world, got, described=True)


# -- fish -------------------------------------------------------------------------


async def test_fish_completes_commands_jobs_teams_models_and_served_names(
        world: World, tmp_path: Path) -> None:
    fish = _shell("fish")
    lines = list(_expected(world))
    script = "cosmicac --show-completion | source\n" + "".join(
        f"complete -C {_fish_quote(line)}; echo '<<<END>>>'\n" for line in lines)
    out = await _run(world, [fish, "--no-config", "-c", script], tmp_path)
    answers = out.split("<<<END>>>\n")
    assert len(answers) == len(lines) + 1, out
    got = {}
    for line, answer in zip(lines, answers, strict=False):
        rows = [row.partition("\t") for row in answer.splitlines() if row]
        got[line] = {value: description for value, _, description in rows}
    _check(world, got, described=True)


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
