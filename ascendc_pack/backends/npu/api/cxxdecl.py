"""A small reader of C++ declarations: the public AscendC kernel API as data.

:func:`scan` reads header text (the CANN ``asc-devkit`` headers, or our emulation's headers after
the preprocessor) and returns what a kernel can name: free functions and function templates of
namespace ``AscendC``, the public methods of its classes (with their base classes), its enums
with their enumerators, and ``#define`` macros. Function bodies are skipped; a declaration keeps
the ``#if`` conditions it sits under (the vendor headers select by ``__NPU_ARCH__``), so a check
can ask for the declarations one architecture sees (:func:`condition_holds`).

This is not a C++ parser: it reads the declaration style of the AscendC headers (one
declaration per statement, ``__aicore__ inline`` qualifiers, attribute macros such as
``__ASC_USE_RESERVED_UBUF__(...)``). Facts only are kept (names, parameter lists, enumerator
values), never code.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

KEYWORDS_NOT_NAMES = {"if", "for", "while", "switch", "return", "sizeof", "decltype", "static_assert",
                      "alignas", "alignof", "noexcept", "__attribute__", "defined", "new", "delete", "throw",
                      "catch", "typeid", "static_cast", "reinterpret_cast", "const_cast", "dynamic_cast"}
QUALIFIERS = {"__aicore__", "inline", "__inline__", "static", "constexpr", "extern", "virtual", "explicit",
              "__global__", "__sync_alias__", "__forceinline__", "friend", "[[nodiscard]]", "__simd_vf__",
              "__simd_callee__", "__BLOCK_LOCAL__"}
GUARD = re.compile(r"\w+_(H|H_|HPP|INC|INCLUDED)_*")
TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<str>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*')
  | (?P<num>\.?\d[\w.]*(?:[eEpP][+-]\d+)?\w*)
  | (?P<id>[A-Za-z_]\w*)
  | (?P<op>::|->|\.\.\.|<<=|>>=|&&|\|\||==|!=|<=|>=|\+\+|--|[-+*/%&|^!~<>=?:;,.()\[\]{}#@\\])
""", re.VERBOSE)


@dataclass
class Param:
    type: str
    name: str
    default: str | None = None


@dataclass
class Function:
    scope: str                    # "AscendC" or "AscendC::TQue"
    name: str
    template: list[str]           # template parameter declarations, e.g. ["typename T", "bool isSetMask = true"]
    params: list[Param]
    returns: str
    conditions: list[str] = field(default_factory=list)
    file: str = ""

    @property
    def required(self) -> int:
        return sum(1 for p in self.params if p.default is None)


@dataclass
class ClassInfo:
    scope: str
    name: str
    template: list[str]
    bases: list[str]
    conditions: list[str] = field(default_factory=list)
    file: str = ""


@dataclass
class Enum:
    scope: str
    name: str
    scoped: bool
    values: dict[str, int | str]
    conditions: list[str] = field(default_factory=list)
    file: str = ""


@dataclass
class Api:
    functions: list[Function] = field(default_factory=list)
    classes: list[ClassInfo] = field(default_factory=list)
    enums: list[Enum] = field(default_factory=list)
    macros: dict[str, list[str]] = field(default_factory=dict)   # name -> conditions (one list per definition)

    def to_json(self) -> dict:
        return {"functions": [asdict(f) for f in self.functions], "classes": [asdict(c) for c in self.classes],
                "enums": [asdict(e) for e in self.enums], "macros": self.macros}


def strip_comments(text: str) -> str:
    """Comments replaced by blanks (newlines kept, so line structure survives)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            chunk = text[i:(n if j < 0 else j + 2)]
            out.append("\n" * chunk.count("\n"))
            i = n if j < 0 else j + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _logical_lines(text: str):
    buf = ""
    for line in text.split("\n"):
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        yield buf + line
        buf = ""
    if buf:
        yield buf


def _split_preprocessor(text: str, api: Api) -> list[tuple[str, tuple[str, ...]]]:
    """Code lines with the ``#if`` conditions they sit under; ``#define``s recorded as macros."""
    stack: list[list[str]] = []      # per #if: the conditions of its branches so far
    lines = []

    def current() -> tuple[str, ...]:
        return tuple(branch[-1] for branch in stack if branch[-1] != "1")
    for line in _logical_lines(text):
        s = line.strip()
        if not s.startswith("#"):
            lines.append((line, current()))
            continue
        m = re.match(r"#\s*(\w+)\s*(.*)", s)
        if not m:
            continue
        d, rest = m.group(1), m.group(2).strip()
        if d in ("if", "ifdef", "ifndef"):
            cond = {"if": rest, "ifdef": f"defined({rest})", "ifndef": f"!defined({rest})"}[d]
            if d == "ifndef" and GUARD.fullmatch(rest):
                cond = "1"  # an include guard
            stack.append([cond])
        elif d == "elif" and stack:
            prev = " && ".join(f"!({c})" for c in stack[-1] if not c.startswith("!(("))
            stack[-1].append(f"(({rest})) && {prev}" if prev else rest)
        elif d == "else" and stack:
            stack[-1].append(" && ".join(f"!({c})" for c in stack[-1] if not c.startswith("!((")) or "1")
        elif d == "endif" and stack:
            stack.pop()
        elif d == "define":
            name = re.match(r"(\w+)", rest)
            if name and not name.group(1).endswith("_H") and not name.group(1).endswith("_H_"):
                api.macros.setdefault(name.group(1), []).append(" && ".join(current()))
    return lines


def _tokens(lines):
    out = []
    for text, cond in lines:
        for m in TOKEN.finditer(text):
            if m.lastgroup != "ws":
                out.append((m.group(), m.lastgroup, cond))
    return out


def _skip_group(toks, i, open_, close):
    """Index after the group starting at toks[i] == open_ (angle brackets count only < >)."""
    depth = 0
    while i < len(toks):
        t = toks[i][0]
        if t == open_:
            depth += 1
        elif t == close:
            depth -= 1
            if depth == 0:
                return i + 1
        elif open_ == "<" and t == ">>":
            depth -= 2
            if depth <= 0:
                return i + 1
        elif open_ == "<" and t in (";", "{") and depth:
            return i  # not a template argument list after all
        i += 1
    return i


def _join(toks) -> str:
    text = ""
    for t in toks:
        word = t[0]
        if text and (re.match(r"\w", word) and re.search(r"\w$", text) or word in ("&", "*") and text[-1] != ","):
            text += " "
        elif text.endswith(",") or text.endswith(";"):
            text += " "
        text += word
    return re.sub(r"\s*([<>])\s*", r"\1", text).replace(",", ", ").replace(",  ", ", ")


def _split_top(toks, sep=","):
    parts, depth, cur = [], 0, []
    for t in toks:
        w = t[0]
        if w in "(<[{":
            depth += 1
        elif w in ")>]}":
            depth -= 1
        elif w == ">>":
            depth -= 2
        if w == sep and depth == 0:
            parts.append(cur)
            cur = []
        else:
            cur.append(t)
    if cur:
        parts.append(cur)
    return parts


def _param(toks) -> Param:
    default = None
    for k, t in enumerate(toks):
        if t[0] == "=":
            default = _join(toks[k + 1:])
            toks = toks[:k]
            break
    toks = [t for t in toks if t[0] not in ("__gm__", "__ubuf__")]
    if toks and toks[-1][0] == "]":       # const uint64_t mask[]
        k = max(i for i, t in enumerate(toks) if t[0] == "[")
        name_at = k - 1
        if name_at >= 1 and toks[name_at][1] == "id":
            return Param(_join(toks[:name_at] + toks[k:]), toks[name_at][0], default)
    if len(toks) >= 2 and toks[-1][1] == "id" and toks[-2][0] not in ("::", "<", ","):
        return Param(_join(toks[:-1]), toks[-1][0], default)
    return Param(_join(toks), "", default)


def scan(text: str, file: str = "", api: Api | None = None, namespace: str = "AscendC",
         global_scope: bool = True) -> Api:
    """Add the declarations of ``text`` (one header) under ``namespace`` (and, with
    ``global_scope``, at file scope: ``GetTPipePtr``, the kernel-type enum) to ``api``."""
    api = api if api is not None else Api()
    toks = _tokens(_split_preprocessor(strip_comments(text), api))
    scopes: list[tuple[str, str, bool]] = []   # (kind, name, public) per open brace
    i, n = 0, len(toks)
    template: list[str] | None = None
    stmt_start = True

    def scope_name() -> str:
        names = [s[1] for s in scopes if s[0] in ("namespace", "class")]
        return "::".join(names)

    def wanted() -> bool:
        s = scope_name()
        if not (s == namespace or s.startswith(namespace + "::") or (global_scope and s in ("", "linkage"))):
            return False
        inner = [sc for sc in scopes if sc[0] == "class"]
        return all(sc[2] for sc in inner) and not any(sc[0] == "block" for sc in scopes)

    while i < n:
        w, kind, cond = toks[i]
        if w == "{":
            scopes.append(("block", "", False))
            i += 1
            stmt_start, template = True, None
            continue
        if w == "}":
            if scopes:
                scopes.pop()
            i += 1
            if i < n and toks[i][0] == ";":
                i += 1
            stmt_start, template = True, None
            continue
        if w == ";":
            i += 1
            stmt_start, template = True, None
            continue
        if w in ("public", "private", "protected") and i + 1 < n and toks[i + 1][0] == ":":
            if scopes and scopes[-1][0] == "class":
                scopes[-1] = ("class", scopes[-1][1], w == "public")
            i += 2
            continue
        if w == "namespace":
            j = i + 1
            name = []
            while j < n and toks[j][0] != "{" and toks[j][0] != ";" and toks[j][0] != "=":
                name.append(toks[j][0])
                j += 1
            if j < n and toks[j][0] == "{":
                scopes.append(("namespace", "".join(name) or "<anon>", True))
                i = j + 1
            else:
                i = j
            continue
        if w == "extern" and i + 1 < n and toks[i + 1][1] == "str":
            i += 2
            if i < n and toks[i][0] == "{":
                scopes.append(("namespace", scope_name().split("::")[-1] if scopes else "", True))
                scopes[-1] = ("linkage", "", True)
                i += 1
            continue
        if w == "template" and i + 1 < n and toks[i + 1][0] == "<":
            end = _skip_group(toks, i + 1, "<", ">")
            template = [_join(p) for p in _split_top(toks[i + 2:end - 1])]
            i = end
            continue
        if w in ("using", "typedef", "static_assert", "friend"):
            depth = 0
            while i < n and not (toks[i][0] == ";" and depth == 0):
                depth += toks[i][0] in "({[" and 1 or 0
                depth -= toks[i][0] in ")}]" and 1 or 0
                i += 1
            continue
        if w == "enum":
            j = i + 1
            scoped = j < n and toks[j][0] in ("class", "struct")
            j += scoped
            name = toks[j][0] if j < n and toks[j][1] == "id" else ""
            while j < n and toks[j][0] not in ("{", ";"):
                j += 1
            if j < n and toks[j][0] == "{":
                end = _skip_group(toks, j, "{", "}")
                values, nxt = {}, 0
                for part in _split_top(toks[j + 1:end - 1]):
                    if not part:
                        continue
                    key = part[0][0]
                    if len(part) > 2 and part[1][0] == "=":
                        expr = _join(part[2:])
                        try:
                            nxt = int(expr.rstrip("uUlL"), 0)
                            values[key] = nxt
                        except ValueError:
                            values[key] = values.get(expr, expr)
                            nxt = values[key] if isinstance(values[key], int) else nxt
                    else:
                        values[key] = nxt
                    nxt = (values[key] + 1) if isinstance(values[key], int) else nxt + 1
                if wanted() and name:
                    api.enums.append(Enum(scope_name(), name, scoped, values, list(cond), file))
                i = end
            else:
                i = j
            continue
        if w in ("class", "struct", "union") and stmt_start:
            j = i + 1
            while j < n and toks[j][0] in ("alignas",) or (j < n and toks[j][0].startswith("__")):
                j = _skip_group(toks, j + 1, "(", ")") if j + 1 < n and toks[j + 1][0] == "(" else j + 1
            name = toks[j][0] if j < n and toks[j][1] == "id" else ""
            k = j + 1 if name else j
            if k < n and toks[k][0] == "<":   # a specialisation
                k = _skip_group(toks, k, "<", ">")
            bases = []
            if k < n and toks[k][0] == ":":
                parts = []
                while k < n and toks[k][0] not in ("{", ";"):
                    parts.append(toks[k])
                    k += 1
                bases = [_join([t for t in p if t[0] not in ("public", "private", "protected", "virtual")])
                         for p in _split_top(parts[1:])]
            while k < n and toks[k][0] not in ("{", ";"):
                k += 1
            if k < n and toks[k][0] == "{":
                if name and wanted():
                    api.classes.append(ClassInfo(scope_name(), name, template or [], bases, list(cond), file))
                scopes.append(("class", name or "<anon>", w != "class"))
                i = k + 1
            else:
                i = k + 1 if k < n else k
            stmt_start, template = True, None
            continue
        # a declaration statement: find its first top-level '(' preceded by a name
        j = i
        head = []
        func = None
        while j < n and toks[j][0] not in (";", "{", "}"):
            t = toks[j]
            if t[0] == "[" and j + 1 < n and toks[j + 1][0] == "[":
                j = _skip_group(toks, j, "[", "]")
                continue
            if t[0] == "__attribute__" or (re.fullmatch(r"__\w+__", t[0]) and j + 1 < n
                                           and toks[j + 1][0] == "("
                                           and toks[_skip_group(toks, j + 1, "(", ")")][1] == "id"):
                j = _skip_group(toks, j + 1, "(", ")")
                continue
            if t[0] == "<" and head and head[-1][1] == "id":
                end = _skip_group(toks, j, "<", ">")
                head += toks[j:end]
                j = end
                continue
            if t[0] == "operator":
                k = j + 1
                op = []
                if k < n and toks[k][0] == "(":
                    op, k = ["()"], k + 2
                while k < n and toks[k][0] != "(":
                    op.append(toks[k][0])
                    k += 1
                head.append(("operator" + "".join(op), "id", cond))
                j = k
                continue
            if t[0] == "(":
                if head and head[-1][1] == "id" and head[-1][0] not in KEYWORDS_NOT_NAMES and head[-1][0] not in QUALIFIERS:
                    end = _skip_group(toks, j, "(", ")")
                    func = (head, toks[j + 1:end - 1], end)
                break
            if t[0] == "=":
                break
            head.append(t)
            j += 1
        if func is not None:
            head, params, end = func
            name = head[-1][0]
            ret = [t for t in head[:-1] if t[0] not in QUALIFIERS]
            if ret and ret[-1][0] == "::":   # out-of-class definition Foo::bar(): not a declaration of the API
                name = None
            k = end
            while k < n and toks[k][0] not in (";", "{", "=", ":"):
                k += 1
            if k < n and toks[k][0] == ":":   # constructor initialiser list
                while k < n and toks[k][0] != "{":
                    k += 1
            deleted = False
            if k < n and toks[k][0] == "=":
                deleted = k + 1 < n and toks[k + 1][0] == "delete"
                while k < n and toks[k][0] != ";":
                    k += 1
            if name and wanted() and not name.startswith("~") and not deleted:
                ps = [] if [t[0] for t in params] in ([], ["void"]) else [_param(p) for p in _split_top(params)]
                api.functions.append(Function(scope_name(), name, template or [], ps, _join(ret), list(cond), file))
            if k < n and toks[k][0] == "{":
                i = _skip_group(toks, k, "{", "}")
            else:
                i = k + 1
            stmt_start, template = True, None
            continue
        # anything else: skip to the end of the statement
        depth = 0
        while i < n:
            t = toks[i][0]
            if t in ("(", "["):
                depth += 1
            elif t in (")", "]"):
                depth -= 1
            elif t == "{" and depth == 0:
                i = _skip_group(toks, i, "{", "}")
                if i < n and toks[i][0] == ";":
                    i += 1
                break
            elif t == ";" and depth == 0:
                i += 1
                break
            elif t == "}" and depth == 0:
                break
            i += 1
        stmt_start, template = True, None
    return api


# ----------------------------------------------------------------------------- conditions
_ARCH = re.compile(r"__NPU_ARCH__\s*(==|!=|>=|<=|>|<)\s*(\d+)")


def condition_holds(conditions: list[str], arch: int, macros: dict[str, int] | None = None) -> bool:
    """Whether every condition holds for ``__NPU_ARCH__ == arch`` (and ``macros`` defined with
    their values). A condition on anything else is taken as true: the extracted table is the
    union, narrowed only where the headers select by architecture."""
    env = {"__NPU_ARCH__": arch, **(macros or {})}
    for c in conditions:
        expr = c
        expr = re.sub(r"defined\s*\(\s*(\w+)\s*\)", lambda m: "1" if m.group(1) in env else "0", expr)
        expr = re.sub(r"defined\s+(\w+)", lambda m: "1" if m.group(1) in env else "0", expr)
        known = set(re.findall(r"[A-Za-z_]\w*", expr))
        if not known <= set(env):
            if "__NPU_ARCH__" not in c:
                continue
            # mixed: evaluate the architecture comparisons, unknown names as true
            expr = _ARCH.sub(lambda m: "1" if eval(f"{arch}{m.group(1)}{m.group(2)}") else "0", expr)  # noqa: S307
            expr = re.sub(r"[A-Za-z_]\w*", "1", expr)
        else:
            expr = re.sub(r"[A-Za-z_]\w*", lambda m: str(env[m.group()]), expr)
        expr = expr.replace("&&", " and ").replace("||", " or ").replace("!", " not ").replace(" not =", "!=")
        try:
            if not eval(expr, {"__builtins__": {}}):  # noqa: S307 - arithmetic on digits only
                return False
        except Exception:  # noqa: BLE001 - an expression we cannot read: keep the declaration
            continue
    return True
