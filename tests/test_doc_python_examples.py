"""Every ```python block of the Markdown files is checked against the current code.

Each block compiles and its imports of ``toolwire*`` names resolve. What else is checked
is said by an HTML comment on the line right before the fence:

- no comment: a complete program. It runs in a fresh interpreter (cwd: an empty temp
  directory) and must succeed; the text after ``# ->`` on a line (``print(x)  # -> 3``)
  is a line of its output, and these lines appear in that order.
- ``<!-- python: fragment [package] -->``: the block needs what the docs do not show (a
  kernel, a ``ctx``, a real search API or agent). It compiles (top-level ``await`` allowed)
  and its imports resolve; relative imports are resolved against ``package``.
- ``<!-- python: signature [owner] -->``: an API listing: ``def f(...) -> T`` without a
  body, ``Name(field: T = default, ...)`` for a constructor, ``class C:`` with such
  methods and attributes; ``<factory>`` / ``<factory: value>`` stand for a default
  factory. Each name is looked up in ``owner`` (a module or class, default ``toolwire``);
  its parameters (names, kinds, defaults, annotations), return annotation, ``async``,
  ``classmethod``/``staticmethod`` and the class attributes listed must match the code.
- ``<!-- python: pytest -->``: a test module; it passes under pytest (the toolwire
  fixtures come from its pytest plugin).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import io
import os
import re
import subprocess
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE_SRC = ROOT / "contrib/_template/src"  # toolwire_stamp: not installed, tested from src
KINDS = ("run", "fragment", "signature", "pytest")
_FENCE = re.compile(r"^(\s*)```python\s*$")
_MARKER = re.compile(r"^\s*<!--\s*python:\s*(\S+)(?:\s+(\S+))?\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    where: str  # path:line of the opening fence
    source: str  # dedented
    kind: str  # one of KINDS
    arg: str | None  # the package (fragment) or owner (signature)


def blocks_of(text: str, name: str) -> list[Block]:
    """The ```python blocks of ``text`` with their marker (``name``: for ``where``)."""
    lines = text.splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent = len(m.group(1))
        end = i + 1
        while end < len(lines) and not re.match(r"^\s*```\s*$", lines[end]):
            end += 1
        if end == len(lines):
            raise ValueError(f"{name}:{i + 1}: the ```python fence is never closed")
        body = [ln[indent:] if ln[:indent].strip() == "" else ln for ln in lines[i + 1 : end]]
        kind, arg = "run", None
        marker = _MARKER.match(lines[i - 1]) if i else None
        if marker:
            kind, arg = marker.group(1), marker.group(2)
            if kind not in KINDS[1:]:
                raise ValueError(
                    f"{name}:{i}: unknown marker kind {kind!r}; use one of {KINDS[1:]}"
                )
        out.append(Block(f"{name}:{i + 1}", "\n".join(body) + "\n", kind, arg))
        i = end + 1
    return out


def _markdown_files() -> list[Path]:
    skip = {"node_modules", "build", "dist"}
    return sorted(
        p
        for p in ROOT.rglob("*.md")
        if not any(part.startswith(".") or part in skip for part in p.relative_to(ROOT).parts)
    )


def _all_blocks() -> list[Block]:
    return [
        b
        for md in _markdown_files()
        for b in blocks_of(md.read_text(encoding="utf-8"), str(md.relative_to(ROOT)))
    ]


BLOCKS = _all_blocks()


# ------------------------------------------------------------------ imports
def _resolve(name: str) -> Any:
    """The module or object named by a dotted ``name`` (longest importable prefix)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:n]))
        except ModuleNotFoundError:
            continue
        for attr in parts[n:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(name)


def import_problems(tree: ast.AST, package: str | None) -> list[str]:
    """Imports of ``toolwire*`` modules and names in ``tree`` that do not resolve."""
    problems: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                if package is None:
                    problems.append(
                        f"relative import from {'.' * node.level}{module}: name the package "
                        "in the marker (<!-- python: fragment PACKAGE -->)"
                    )
                    continue
                module = importlib.util.resolve_name("." * node.level + module, package)
            targets = [(module, a.name) for a in node.names]
        else:
            continue
        for module, name in targets:
            if not module.startswith("toolwire"):
                continue
            try:
                mod = importlib.import_module(module)
            except ImportError as exc:
                problems.append(f"import {module}: {exc}")
                continue
            if name is None or name == "*" or hasattr(mod, name):
                continue
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                problems.append(f"from {module} import {name}: {module} has no {name!r}")
    return problems


# --------------------------------------------------------------- signatures
def _has_body(logical: list[tokenize.TokenInfo]) -> bool:
    """Whether a logical line has a ``:`` outside brackets after its first ``(...)``
    (``def f() -> T: ...``, ``class C:``), or is not of the form ``X(...) ...``."""
    depth, opened = 0, False
    for tok in logical:
        if tok.string in "([{" and tok.type == tokenize.OP:
            depth, opened = depth + 1, True
        elif tok.string in ")]}" and tok.type == tokenize.OP:
            depth -= 1
        elif tok.string == ":" and depth == 0 and (opened or logical[0].string == "class"):
            return True
    return not opened


def signature_stub(src: str) -> str:
    """``src`` (an API listing) made valid Python: bodies ``: ...`` added to ``def``
    lines, ``Name(...)`` lines turned into ``def Name(...): ...``, ``<factory>`` into
    ``__factory__`` and ``<factory: value>`` into ``__factory__(value)``."""
    src = re.sub(r"<factory: (.+?)>(?=\s*[,)])", r"__factory__(\1)", src)
    src = src.replace("<factory>", "__factory__")
    lines = src.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []  # (row, col, text), rows 1-based
    logical: list[tokenize.TokenInfo] = []
    skip = {tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT}
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            if logical and not _has_body(logical):
                first, last = logical[0], logical[-1]
                words = [t.string for t in logical[:2]]
                if words[0] == "def" or words == ["async", "def"]:
                    edits.append((last.end[0], last.end[1], ": ..."))
                elif first.type == tokenize.NAME and len(logical) > 1 and words[1] == "(":
                    edits.append((last.end[0], last.end[1], ": ..."))
                    edits.append((first.start[0], first.start[1], "def "))
            logical = []
        elif tok.type not in skip:
            logical.append(tok)
    for row, col, text in sorted(edits, reverse=True):
        line = lines[row - 1]
        lines[row - 1] = line[:col] + text + line[col:]
    return "".join(lines)


def _norm_annotation(ann: Any) -> str:
    text = ann if isinstance(ann, str) else inspect.formatannotation(ann)
    text = re.sub(r"\b(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_])", "", text)  # module paths
    return re.sub(r"\s+", "", text.replace("'", '"'))


def _namespace(obj: Any) -> dict[str, Any]:
    import toolwire

    module = sys.modules.get(getattr(obj, "__module__", "") or "")
    return {**vars(toolwire), **(vars(module) if module else {})}


def _factory_of(owner: Any, name: str) -> Any:
    """The default factory of field ``name`` of a dataclass or pydantic model."""
    if dataclasses.is_dataclass(owner):
        return {f.name: f for f in dataclasses.fields(owner)}[name].default_factory
    return owner.model_fields[name].default_factory


def _default_problem(doc: ast.expr, real: Any, owner: Any, param: str) -> str | None:
    if isinstance(doc, ast.Name) and doc.id == "__factory__":
        return None if repr(real) == "<factory>" else f"default is {real!r}, not a factory"
    if isinstance(doc, ast.Call) and getattr(doc.func, "id", None) == "__factory__":
        if repr(real) != "<factory>":
            return f"default is {real!r}, not a factory"
        made = _factory_of(owner, param)()
        want = ast.literal_eval(doc.args[0])
        return None if made == want else f"the factory makes {made!r}, not {want!r}"
    text = ast.unparse(doc)
    try:
        value = eval(text, _namespace(owner))
    except Exception as exc:
        return f"default {text} does not evaluate ({exc!r})"
    if real is inspect.Parameter.empty:
        return f"has no default (docs: {text})"
    same = value == real and type(value) is type(real)
    return None if same else f"default is {real!r} (docs: {text})"


def _doc_params(args: ast.arguments) -> list[tuple[str, Any, ast.expr | None, ast.expr | None]]:
    """(name, kind, annotation, default) of every parameter of a parsed ``def``."""
    P = inspect.Parameter
    positional = [(a, P.POSITIONAL_ONLY) for a in args.posonlyargs]
    positional += [(a, P.POSITIONAL_OR_KEYWORD) for a in args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    defaults += list(args.defaults)
    out = [(a.arg, k, a.annotation, d) for (a, k), d in zip(positional, defaults, strict=True)]
    if args.vararg:
        out.append((args.vararg.arg, P.VAR_POSITIONAL, args.vararg.annotation, None))
    for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        out.append((a.arg, P.KEYWORD_ONLY, a.annotation, d))
    if args.kwarg:
        out.append((args.kwarg.arg, P.VAR_KEYWORD, args.kwarg.annotation, None))
    return out


def _callable_problems(node: ast.FunctionDef | ast.AsyncFunctionDef, container: Any) -> list[str]:
    where = f"{getattr(container, '__name__', container)}.{node.name}"
    if isinstance(container, type):
        try:
            attr = inspect.getattr_static(container, node.name)
        except AttributeError:
            return [f"{where} does not exist"]
    elif not hasattr(container, node.name):
        return [f"{where} does not exist"]
    else:
        attr = getattr(container, node.name)
    problems: list[str] = []
    decorators = {ast.unparse(d) for d in node.decorator_list}
    for deco, kind in (("classmethod", classmethod), ("staticmethod", staticmethod)):
        if (deco in decorators) != isinstance(attr, kind):
            problems.append(f"{where}: the docs say {deco} {deco in decorators}, the code not")
    func = attr.__func__ if isinstance(attr, classmethod | staticmethod) else attr
    ctor = isinstance(func, type)  # Name(...) listing: the constructor's parameters
    if not ctor:
        is_async = inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func)
        if isinstance(node, ast.AsyncFunctionDef) != is_async:
            problems.append(f"{where}: async in the docs or the code, not both")
    sig = inspect.signature(func)
    pydantic_fields = getattr(func, "model_fields", None) if ctor else None
    doc = _doc_params(node.args)
    doc_shape = [(n, k.name) for n, k, _, _ in doc]
    real_shape = [(p.name, p.kind.name) for p in sig.parameters.values()]
    if doc_shape != real_shape:
        only_doc = [n for n in doc_shape if n not in real_shape]
        only_code = [n for n in real_shape if n not in doc_shape]
        problems.append(
            f"{where}: parameters differ: only in the docs {only_doc}, only in the code "
            f"{only_code}" + ("" if only_doc or only_code else " (order)")
        )
        return problems
    for name, _, ann, default in doc:
        param = sig.parameters[name]
        if default is None and param.default is not inspect.Parameter.empty:
            problems.append(f"{where}({name}): the code has a default ({param.default!r})")
        elif default is not None:
            bad = _default_problem(default, param.default, func, name)
            if bad:
                problems.append(f"{where}({name}): {bad}")
        real_ann = pydantic_fields[name].annotation if pydantic_fields else param.annotation
        if ann is None and real_ann is not inspect.Parameter.empty and name not in ("self", "cls"):
            problems.append(f"{where}({name}): no annotation in the docs")
        elif ann is not None and _norm_annotation(ast.unparse(ann)) != _norm_annotation(real_ann):
            problems.append(
                f"{where}({name}): annotated {ast.unparse(ann)} in the docs, "
                f"{_norm_annotation(real_ann)} in the code"
            )
    if ctor:
        if node.returns is not None:
            problems.append(f"{where}: a constructor listing has no return annotation")
    elif node.returns is None:
        problems.append(f"{where}: no return annotation in the docs")
    elif _norm_annotation(ast.unparse(node.returns)) != _norm_annotation(sig.return_annotation):
        problems.append(
            f"{where}: returns {ast.unparse(node.returns)} in the docs, "
            f"{_norm_annotation(sig.return_annotation)} in the code"
        )
    return problems


def _attribute_problem(node: ast.Assign | ast.AnnAssign, cls: type) -> str | None:
    target = node.targets[0] if isinstance(node, ast.Assign) else node.target
    assert isinstance(target, ast.Name), ast.unparse(node)
    try:
        real = inspect.getattr_static(cls, target.id)
    except AttributeError:
        return f"{cls.__name__}.{target.id} does not exist"
    if node.value is None:
        return None
    try:
        value = eval(ast.unparse(node.value), _namespace(cls))
    except Exception as exc:
        return f"{cls.__name__}.{target.id}: {ast.unparse(node.value)} does not evaluate ({exc!r})"
    if isinstance(value, classmethod | staticmethod) and type(value) is type(real):
        value, real = value.__func__, real.__func__
    if value != real:
        return f"{cls.__name__}.{target.id} is {real!r} (docs: {ast.unparse(node.value)})"
    return None


def signature_problems(src: str, owner_name: str) -> list[str]:
    """What the API listing ``src`` says that the code under ``owner_name`` does not."""
    owner = _resolve(owner_name)
    problems: list[str] = []
    for node in ast.parse(signature_stub(src)).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            problems += _callable_problems(node, owner)
        elif isinstance(node, ast.ClassDef):
            cls = getattr(owner, node.name, None)
            if not isinstance(cls, type):
                problems.append(f"{owner_name}.{node.name} is not a class")
                continue
            for base in node.bases:
                if not issubclass(cls, eval(ast.unparse(base), _namespace(cls))):
                    problems.append(f"{node.name} is not a subclass of {ast.unparse(base)}")
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    problems += _callable_problems(item, cls)
                elif isinstance(item, ast.Assign | ast.AnnAssign):
                    bad = _attribute_problem(item, cls)
                    if bad:
                        problems.append(bad)
                else:
                    problems.append(f"{node.name}: cannot check {ast.unparse(item)!r}")
        else:
            problems.append(f"cannot check {ast.unparse(node)!r} (not a def, class or Name(...))")
    return problems


# ---------------------------------------------------------------- running
def expected_output(src: str) -> list[str]:
    """The output lines a program block shows: the text after ``# ->`` on its lines."""
    return [m.group(1).rstrip() for m in re.finditer(r"#\s*->\s?(.*)$", src, re.M)]


def missing_output(expected: list[str], stdout: str) -> list[str]:
    """The ``expected`` lines that are not, in this order, lines of ``stdout``."""
    lines = iter(ln.rstrip() for ln in stdout.splitlines())
    return [want for want in expected if not any(got == want.rstrip() for got in lines)]


def _env() -> dict[str, str]:
    """The environment of a block: no toolwire settings but the test Redis URLs;
    ``toolwire_stamp`` (the plugin template) importable."""
    keep = {"TOOLWIRE_REDIS_URL", "TOOLWIRE_REDIS_CLUSTER_URL"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWIRE_") or k in keep}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(TEMPLATE_SRC), os.environ.get("PYTHONPATH")) if p
    )
    return env


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=90, check=False
    )


@pytest.mark.parametrize("block", BLOCKS, ids=[b.where for b in BLOCKS])
def test_python_block(block: Block, tmp_path: Path) -> None:
    src = signature_stub(block.source) if block.kind == "signature" else block.source
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT if block.kind == "fragment" else 0
    try:
        tree = compile(src, block.where, "exec", flags | ast.PyCF_ONLY_AST, dont_inherit=True)
        compile(tree, block.where, "exec", flags, dont_inherit=True)
    except SyntaxError as exc:
        pytest.fail(f"{block.where}: does not compile ({exc}); the block:\n{block.source}")
    package = block.arg if block.kind == "fragment" else None
    bad_imports = import_problems(tree, package)
    assert not bad_imports, f"{block.where}: " + "; ".join(bad_imports)

    if block.kind == "signature":
        problems = signature_problems(block.source, block.arg or "toolwire")
        assert not problems, f"{block.where} does not match the code:\n" + "\n".join(problems)
    elif block.kind == "run":
        proc = _run([sys.executable, "-c", block.source], tmp_path)
        assert proc.returncode == 0, f"{block.where} failed:\n{proc.stdout}\n{proc.stderr}"
        missing = missing_output(expected_output(block.source), proc.stdout)
        assert not missing, (
            f"{block.where}: output lines missing (or out of order): {missing}\n"
            f"output:\n{proc.stdout}"
        )
    elif block.kind == "pytest":
        tests = len(re.findall(r"^(?:async )?def test_", block.source, re.M))
        assert tests, f"{block.where}: a pytest block without a test"
        (tmp_path / "test_block.py").write_text(block.source, encoding="utf-8")
        proc = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], tmp_path)
        assert proc.returncode == 0, f"{block.where} failed under pytest:\n{proc.stdout}"
        summary = re.search(r"^(\d+) passed in ", proc.stdout, re.M)  # and nothing else
        assert summary and int(summary.group(1)) >= tests, proc.stdout


# ---------------------------------------------------- the checks themselves
def test_the_blocks_are_found_with_their_markers() -> None:
    assert len(BLOCKS) >= 45
    assert sum(b.kind == "run" for b in BLOCKS) >= 5
    assert [b.kind for b in BLOCKS if b.where.startswith("README.md:")] == ["run"]
    assert all(b.kind == "signature" for b in BLOCKS if b.where.startswith("docs/api.md"))
    text = (
        "x\n<!-- python: fragment toolwire_search -->\n  ```python\n  from . import a\n"
        "  ```\n```python\nprint(1)  # -> 1\n```\n"
    )
    first, second = blocks_of(text, "t.md")
    assert (first.where, first.kind, first.arg, first.source) == (
        "t.md:3",
        "fragment",
        "toolwire_search",
        "from . import a\n",
    )
    assert (second.where, second.kind, expected_output(second.source)) == ("t.md:6", "run", ["1"])
    with pytest.raises(ValueError, match="unknown marker kind 'fragmnt'"):
        blocks_of("<!-- python: fragmnt -->\n```python\n```\n", "t.md")


def test_a_marker_stands_right_before_a_python_fence() -> None:
    """A marker anywhere else would be ignored silently (the block would run)."""
    stray = []
    for md in _markdown_files():
        lines = md.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            if _MARKER.match(line) and not _FENCE.match(nxt):
                stray.append(f"{md.relative_to(ROOT)}:{i + 1}")
    assert not stray, f"markers not followed by a ```python fence: {stray}"


def test_missing_output_is_reported_in_order() -> None:
    out = "a\nb\nc\n"
    assert missing_output(["a", "c"], out) == []
    assert missing_output(["c", "a"], out) == ["a"]
    assert missing_output(["b "], out) == []  # trailing spaces do not count
    assert missing_output(["d"], out) == ["d"]


def test_import_problems_name_the_missing_names() -> None:
    tree = ast.parse(
        "from toolwire import Kernel, Kernal\nimport toolwire_nope\nimport json\n"
        "from ._backend import Backend, Backnd\n"
    )
    assert import_problems(tree, "toolwire_search") == [
        "from toolwire import Kernal: toolwire has no 'Kernal'",
        "import toolwire_nope: No module named 'toolwire_nope'",
        "from toolwire_search._backend import Backnd: toolwire_search._backend has no 'Backnd'",
    ]
    assert import_problems(ast.parse("from . import x\n"), None)[0].startswith("relative import")


def test_signature_problems_catch_each_kind_of_drift() -> None:
    """The signature check fails for a wrong default, a missing or renamed parameter,
    a wrong annotation, a wrong kind, a missing method or attribute, async, and a
    factory that makes something else; and passes for the truth."""
    truth = "def open_store(url: str, *, clock: Callable[[], float] | None = None) -> StateStore\n"
    assert signature_problems(truth, "toolwire") == []
    cases = {
        truth.replace("= None", "= 1"): "clock): default is None (docs: 1)",
        truth.replace("url: str, *, ", "url: str, "): "parameters",
        truth.replace("url: str", "uri: str"): "parameters",
        truth.replace("url: str", "url: bytes"): "annotated bytes in the docs, str in the code",
        truth.replace("-> StateStore", "-> None"): "returns None in the docs",
        truth.replace("def ", "async def "): "async in the docs or the code",
        "def open_shop(url: str) -> None\n": "toolwire.open_shop does not exist",
        "class ToolSet:\n    serial: bool = True\n": "ToolSet.serial is False (docs: True)",
        "class ToolSet:\n    parallel: bool = False\n": "ToolSet.parallel does not exist",
        "class Terminal:\n    def stdio(cls) -> Terminal\n": "classmethod",
        "Attempt(tool: str, duration_ms: float, error_kind: str | None = None, "
        "decision: str | None = <factory>, wait_ms: float = 0.0)": "default is None, not a factory",
    }
    for listing, problem in cases.items():
        found = signature_problems(listing, "toolwire")
        assert any(problem in p for p in found), (listing, found)
    fake = (
        'FakeTool(name: str = "fake", script: list[Any] = <factory: [{"ok": False}]>, '
        'description: str = "A scripted test tool.", input_schema: dict[str, Any] = <factory>, '
        "delay: float = 0.0, read_only: bool | None = None, timeout_s: float | None = None, "
        'source: str = "test", calls: list[dict[str, Any]] = <factory>)\n'
    )
    found = signature_problems(fake, "toolwire.testing")
    assert found == [
        "toolwire.testing.FakeTool(script): the factory makes [{'ok': True}], not [{'ok': False}]"
    ]


def test_the_readme_embedding_example_is_short_and_shows_its_output() -> None:
    """The README's embedding example (run by test_python_block) stays short and shows
    the result and the retried error it prints."""
    block = next(b for b in BLOCKS if b.where.startswith("README.md") and "Kernel(" in b.source)
    assert block.kind == "run"
    assert len(block.source.splitlines()) <= 40
    assert expected_output(block.source) == [
        "{'city': 'Lyon', 'days': 1, 'sky': 'clear'}",
        "unavailable ['unavailable', 'unavailable']",
    ]
