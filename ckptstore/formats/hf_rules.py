"""Name maps between Hugging Face tensors and a MindSpore model's parameters: the rule file format.

A rule file is a small JSON document (docs/FORMAT.md and the README describe it)::

    {"format": "ckptstore-name-map", "version": 1, "description": "...",
     "unmatched": "keep",                        # or "error" / "drop": names no rule matches
     "renames": [{"pattern": "model\\\\.layers\\\\.(\\\\d+)\\\\.self_attn\\\\.q_proj\\\\.weight",
                  "target": "model.layers.\\\\1.attention.wq.weight"}, ...],
     "fusions": [{"pattern": "model\\\\.layers\\\\.(\\\\d+)\\\\.self_attn\\\\.q_proj\\\\.weight",
                  "sources": ["model.layers.\\\\1.self_attn.q_proj.weight", "...k_proj...", "...v_proj..."],
                  "target": "decoder.layers.\\\\1.self_attention.linear_qkv.weight",
                  "axis": 0, "interleave": "qkv-groups",
                  "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads"}, ...]}

A ``pattern`` is a Python regular expression matched against a whole Hugging Face name; a
``target`` or ``source`` is a template of literal text and ``\\N`` / ``\\g<N>`` references to the
pattern's groups. Fusions are tried first (``pattern`` must match the first source's name), then
renames, first match wins. A fusion concatenates its sources along ``axis`` in ``sources``
order, in ``G`` groups: group ``g`` is, for each source in order, its ``g``-th of ``G`` equal
parts. ``interleave`` says what ``G`` is: ``"blocked"`` (``blocks``, default 1: plain
concatenation; ``blocks: tp`` is MindSpeed's gate/up blocked per tensor-parallel rank),
``"interleaved-rows"`` (every row: MindFormers' gate/up ``ffn_concat_hf2mg``) or
``"qkv-groups"`` (one group per KV head: ``[q(n_rep*head_dim); k; v]``, MindFormers'
``qkv_concat_hf2mg``). Head counts and ``blocks`` are integers or the name of a ``config.json``
key (``"a|b"``: the first present). The same rules read backwards name an export's tensors
(:meth:`NameMap.reverse`): a pattern made of literal text and groups inverts by itself; any
other needs ``"reverse": {"pattern": ..., "target": ...}`` in its rule.

Tensor names come from a downloaded folder, so what a rule may cost is bounded: a pattern holds
at most :data:`MAX_QUANTIFIERS` quantifiers (``*``, ``+``, ``{m,n}`` with ``n > 1``), none inside
another's repeated part, no alternation inside a repeated part and no backreference (the forms
that make Python's backtracking matcher take time exponential in the name's length:
``(a+)+b`` against 24 characters took 0.5 s here, doubling with each more), and a name longer
than :data:`MAX_MATCHED_NAME` characters is refused before any rule is tried. What is left costs at
most the name's length to the power of the quantifier count: 4 ms for three ``(.*)`` against a
hostile 256-character name here.

This module is pure (no I/O but reading the rule file): it parses and validates rule files and
computes, from tensor names and shapes, what each target is made of (:func:`fused_segments`).
Errors are :class:`~ckptstore.errors.NameMapError` naming the rule file and the rule.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from math import gcd
from typing import Any

from ckptstore.errors import NameMapError

FORMAT = "ckptstore-name-map"
VERSION = 1
MODES = ("blocked", "interleaved-rows", "qkv-groups")
UNMATCHED = ("keep", "error", "drop")
#: Largest rule file read, and most rules in one (far above any model's needs).
MAX_RULE_FILE_BYTES = 1 << 20
MAX_RULES = 10_000
MAX_SOURCES = 64
#: Most quantifiers in one pattern, and the longest tensor name matched (see the module docstring).
MAX_QUANTIFIERS = 3
MAX_MATCHED_NAME = 256
_SHIPPED = "name_maps"

_REF = re.compile(r"\\(?:g<(\d+)>|(\d+))")
_TOP_KEYS = {"format", "version", "description", "unmatched", "renames", "fusions", "tensor_parallel"}
_TP_KEYS = {"split_rows", "split_columns", "first_stage", "comment"}
_RENAME_KEYS = {"pattern", "target", "reverse", "comment"}
_FUSION_KEYS = {"pattern", "sources", "target", "axis", "interleave", "blocks", "num_heads", "num_kv_heads",
                "head_dim", "reverse", "comment"}


# --- templates and patterns ---------------------------------------------------------------------

@dataclass(frozen=True)
class Template:
    """Literal text and group references (``\\1``, ``\\g<1>``); :meth:`expand` fills them in."""

    parts: tuple[str | int, ...]

    @classmethod
    def parse(cls, text: str) -> Template:
        parts: list[str | int] = []
        pos = 0
        for m in _REF.finditer(text):
            if m.start() > pos:
                parts.append(text[pos:m.start()])
            parts.append(int(m.group(1) or m.group(2)))
            pos = m.end()
        if pos < len(text):
            parts.append(text[pos:])
        if any(isinstance(p, str) and "\\" in p for p in parts):
            raise ValueError(f"template {text!r} holds a backslash that is not a group reference (\\N or \\g<N>)")
        return cls(tuple(parts))

    @property
    def refs(self) -> set[int]:
        return {p for p in self.parts if isinstance(p, int)}

    def expand(self, groups: Mapping[int, str]) -> str:
        return "".join(p if isinstance(p, str) else groups[p] for p in self.parts)


def _invertible(pattern: str) -> Template | None:
    """``pattern`` as a template when it is literal text and capturing groups only (each group
    holding no group of its own), else ``None``: the form whose matches can be written back."""
    p = pattern[1:] if pattern.startswith("^") else pattern
    p = p[:-1] if p.endswith("$") and not p.endswith("\\$") else p
    parts: list[str | int] = []
    i, group = 0, 0
    while i < len(p):
        c = p[i]
        if c == "\\":
            if i + 1 >= len(p) or p[i + 1].isalnum():
                return None  # \d, \w, \1 ...: not a literal
            parts.append(p[i + 1])
            i += 2
        elif c == "(":
            if p.startswith("(?", i):
                return None
            end = _group_end(p, i)
            if end is None:
                return None
            group += 1
            parts.append(group)
            i = end + 1
        elif c in ".^$*+?{}[]|)":
            return None
        else:
            parts.append(c)
            i += 1
    merged: list[str | int] = []
    for part in parts:
        if isinstance(part, str) and merged and isinstance(merged[-1], str):
            merged[-1] += part
        else:
            merged.append(part)
    return Template(tuple(merged))


def _group_end(p: str, start: int) -> int | None:
    """Index of the ``)`` closing the group opened at ``start``, or ``None`` when the group holds
    a capturing group itself (its numbering would no longer be the top-level order)."""
    depth, i, in_class = 0, start, False
    while i < len(p):
        c = p[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(":
            if depth and not p.startswith("(?", i):
                return None
            depth += 1
        elif c == ")":
            depth -= 1
            if not depth:
                return i
        i += 1
    return None


def _group_texts(pattern: str) -> dict[int, str]:
    """The regular expression inside each top-level capturing group of an invertible pattern."""
    out: dict[int, str] = {}
    i, n = 0, 0
    while i < len(pattern):
        if pattern[i] == "\\":
            i += 2
            continue
        if pattern[i] == "(":
            end = _group_end(pattern, i)
            assert end is not None
            n += 1
            out[n] = pattern[i + 1:end]
            i = end + 1
            continue
        i += 1
    return out


@dataclass(frozen=True)
class _Reverse:
    """Reads a target name back: ``regex`` matches targets, ``template`` rebuilds the name the
    forward pattern matched, from the same groups."""

    regex: re.Pattern[str]
    template: Template

    def groups(self, name: str) -> dict[int, str] | None:
        m = self.regex.fullmatch(name)
        if m is None:
            return None
        return {int(k[1:]): v for k, v in m.groupdict().items()}


def _reverse_of(pattern: str, target: Template, explicit: Any, fail: Any) -> _Reverse | None:
    """How to read ``target``'s expansions back into the names ``pattern`` matches."""
    if explicit is not None:
        if not isinstance(explicit, Mapping) or set(explicit) - {"pattern", "target"}:
            raise fail("'reverse' must be an object with 'pattern' and 'target'")
        rx, tmpl = _compile(explicit.get("pattern"), fail, "reverse.pattern"), _template(explicit.get("target"), fail,
                                                                                        "reverse.target")
        # an explicit reverse is written with its own numbered groups: rename them g<N>
        if max(tmpl.refs, default=0) > rx.groups:
            raise fail(f"reverse.target refers to group {max(tmpl.refs)}; reverse.pattern has {rx.groups}")
        named = re.compile(_name_groups(rx.pattern))
        return _Reverse(named, tmpl)
    source = _invertible(pattern)
    if source is None or not source.refs <= target.refs:
        return None
    texts = _group_texts(pattern[1:] if pattern.startswith("^") else pattern)
    seen: set[int] = set()
    out = []
    for part in target.parts:
        if isinstance(part, str):
            out.append(re.escape(part))
        elif part in seen:
            out.append(f"(?P=g{part})")
        else:
            seen.add(part)
            out.append(f"(?P<g{part}>{texts[part]})")
    return _Reverse(re.compile("".join(out)), source)


def _name_groups(pattern: str) -> str:
    """``pattern`` with its top-level capturing groups named ``g1``, ``g2``... (for :class:`_Reverse`)."""
    out, i, n = [], 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if c == "(" and not pattern.startswith("(?", i):
            n += 1
            out.append(f"(?P<g{n}>")
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _compile(text: Any, fail: Any, what: str = "pattern") -> re.Pattern[str]:
    if not isinstance(text, str) or not text or len(text) > 4096:
        raise fail(f"'{what}' is not a non-empty string of at most 4096 characters")
    try:
        compiled = re.compile(text)
    except re.error as e:
        raise fail(f"'{what}' {text!r} is not a regular expression: {e}") from None
    costly = _backtracking(text)
    if costly is not None:
        raise fail(f"'{what}' {text!r} {costly}, whose matching time can grow exponentially (or as a high power) "
                   "with a tensor name's length; write it with fewer, unnested quantifiers")
    return compiled


_REPEATS = ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")


def _backtracking(text: str) -> str | None:
    """What makes ``text`` (a valid pattern) costly to match by backtracking, or ``None``: a
    quantifier inside another's repeated part, an alternation inside a repeated part, a
    backreference, or more than :data:`MAX_QUANTIFIERS` quantifiers."""
    import importlib

    # the stdlib's own (private, untyped) parse of the pattern: no second parser to disagree with re
    parser: Any = importlib.import_module("re._parser")

    count = 0

    def walk(items: Any, repeated: bool) -> str | None:
        nonlocal count
        for op, av in items:
            name = str(op)
            if name in _REPEATS and av[1] > 1:
                if repeated:
                    return "has a quantifier inside another quantifier's repeated part"
                count += 1
                found = walk(av[2], True)
            elif name in _REPEATS:
                found = walk(av[2], repeated)
            elif name == "SUBPATTERN":
                found = walk(av[3], repeated)
            elif name == "BRANCH":
                if repeated:
                    return "has an alternation inside a quantifier's repeated part"
                found = next((f for f in (walk(b, repeated) for b in av[1]) if f is not None), None)
            elif name in ("ASSERT", "ASSERT_NOT"):
                found = walk(av[1], repeated)
            elif name in ("GROUPREF", "GROUPREF_EXISTS"):
                return "has a backreference"
            else:
                continue
            if found is not None:
                return found
        return None

    found = walk(parser.parse(text), False)
    if found is None and count > MAX_QUANTIFIERS:
        return f"has {count} quantifiers (at most {MAX_QUANTIFIERS})"
    return found


def _template(text: Any, fail: Any, what: str) -> Template:
    if not isinstance(text, str) or not text or len(text) > 4096:
        raise fail(f"'{what}' is not a non-empty string of at most 4096 characters")
    try:
        return Template.parse(text)
    except ValueError as e:
        raise fail(str(e)) from None


# --- rules ----------------------------------------------------------------------------------------

Value = int | str | None  # an integer, the name of a config.json key ("a|b": the first present), or absent


@dataclass(frozen=True)
class Rename:
    """``renames[i]``: a Hugging Face name matching ``pattern`` becomes ``target`` expanded."""

    rule: str
    pattern: re.Pattern[str]
    target: Template
    reverse: _Reverse | None


@dataclass(frozen=True)
class Fusion:
    """``fusions[i]``: the ``sources`` (expanded from ``pattern``'s match on the first) become one
    ``target``, concatenated along ``axis`` in groups as ``interleave`` says."""

    rule: str
    pattern: re.Pattern[str]
    sources: tuple[Template, ...]
    target: Template
    axis: int
    interleave: str
    blocks: Value = None
    num_heads: Value = None
    num_kv_heads: Value = None
    head_dim: Value = None
    reverse: _Reverse | None = None


@dataclass(frozen=True)
class Target:
    """One parameter of the mapped store: made of ``sources`` (Hugging Face names, in order),
    concatenated along ``axis`` in ``groups`` groups; ``sizes`` are the sources' lengths along
    ``axis``. A rename has one source and one group. ``rule`` names the rule that made it."""

    name: str
    sources: tuple[str, ...]
    axis: int = 0
    groups: int = 1
    sizes: tuple[int, ...] = ()
    rule: str = ""

    @property
    def fused(self) -> bool:
        return len(self.sources) > 1

    def segments(self) -> list[tuple[int, int, int, int]]:
        """``(source index, source start, length, target start)`` along :attr:`axis`, in target order."""
        return fused_segments(self.sizes, self.groups)


def fused_segments(sizes: Sequence[int], groups: int) -> list[tuple[int, int, int, int]]:
    """Where each part of each source lands in the fusion of ``sizes`` (lengths along the fused
    axis) in ``groups`` groups: ``(source, source start, length, target start)`` in target order.

    Group ``g`` is, for each source ``s`` in order, rows ``[g*k_s, (g+1)*k_s)`` with
    ``k_s = sizes[s] // groups``. One group is plain concatenation; ``groups`` equal to the
    sources' length interleaves them row by row. Raises ``ValueError`` when a size is not a
    multiple of ``groups``.
    """
    if groups < 1 or any(s % groups for s in sizes):
        raise ValueError(f"lengths {list(sizes)} along the fused axis are not all multiples of {groups} groups")
    parts = [s // groups for s in sizes]
    out, at = [], 0
    for g in range(groups):
        for s, k in enumerate(parts):
            if k:
                out.append((s, g * k, k, at))
                at += k
    return out


def segment_gcd(sizes: Sequence[int], groups: int) -> int:
    """The longest run along the fused axis that never straddles two segments (the chunk length
    of a fused view): the greatest common divisor of the parts."""
    g = 0
    for s in sizes:
        g = gcd(g, s // groups)
    return g or 1


@dataclass(frozen=True)
class TensorParallel:
    """How the targets of a rule set are split for tensor parallelism (``tensor_parallel`` in a
    rule file): a target matching a ``split_rows`` pattern is cut along axis 0 (a column-parallel
    linear, a vocabulary-parallel embedding), one matching ``split_columns`` along axis 1 (a
    row-parallel linear); any other is whole on every rank. With pipeline stages, a target with
    ``layers.<i>.`` in its name goes to its layer's stage, one matching ``first_stage`` to the
    first, any other to the last. Used by ``ckptstore strategy``."""

    split_rows: tuple[re.Pattern[str], ...]
    split_columns: tuple[re.Pattern[str], ...]
    first_stage: tuple[re.Pattern[str], ...]


@dataclass(frozen=True)
class NameMap:
    """A parsed rule file (:func:`load_name_map`)."""

    path: str
    renames: tuple[Rename, ...]
    fusions: tuple[Fusion, ...]
    unmatched: str = "keep"
    description: str = ""
    tensor_parallel: TensorParallel | None = None

    def fail(self, problem: str, rule: str | None = None) -> NameMapError:
        return NameMapError(problem, path=self.path, rule=rule)

    def _check_lengths(self, names: Mapping[str, Any], what: str) -> None:
        """Refuse a name longer than :data:`MAX_MATCHED_NAME` before any rule is tried on it."""
        for name in names:
            if len(name) > MAX_MATCHED_NAME:
                raise self.fail(f"{what} name {name[:64]!r}... is {len(name)} characters; a name map matches names "
                                f"of at most {MAX_MATCHED_NAME}")

    # ---- forward: Hugging Face names -> targets

    def apply(self, shapes: Mapping[str, Sequence[int]], config: Mapping[str, Any] | None = None,
              dtypes: Mapping[str, Any] | None = None) -> list[Target]:
        """The targets made of Hugging Face tensors ``shapes`` (name -> shape, in file order).

        ``config`` is the model's ``config.json`` (for head counts named by key); ``dtypes``
        (name -> dtype), when given, must agree within a fusion. Raises :class:`NameMapError`
        naming the rule for a missing source, a source two rules claim, shapes a fusion cannot
        join, two targets of one name, or (``unmatched: error``) a name no rule matches.
        """
        config = config or {}
        self._check_lengths(shapes, "tensor")
        used: dict[str, str] = {}
        targets: list[Target] = []
        for fu in self.fusions:
            for name in shapes:
                m = fu.pattern.fullmatch(name)
                if m is None or name in used:
                    continue
                groups = _match_groups(m)
                sources = [t.expand(groups) for t in fu.sources]
                if sources[0] != name:
                    raise self.fail(f"its pattern matched {name!r} but its first source expands to "
                                    f"{sources[0]!r}; the pattern must match the first source", fu.rule)
                for s in sources:
                    if s not in shapes:
                        raise self.fail(f"source {s!r} of {fu.target.expand(groups)!r} is not in the folder", fu.rule)
                    if s in used:
                        raise self.fail(f"source {s!r} is claimed by {used[s]} too", fu.rule)
                if dtypes is not None and len({str(dtypes[s]) for s in sources}) > 1:
                    raise self.fail(f"sources {sources} have different dtypes "
                                    f"({', '.join(str(dtypes[s]) for s in sources)})", fu.rule)
                targets.append(self._fused(fu, fu.target.expand(groups), sources, [tuple(shapes[s]) for s in sources],
                                           config))
                for s in sources:
                    used[s] = fu.rule
        for name, shape in shapes.items():
            if name in used:
                continue
            for rn in self.renames:
                m = rn.pattern.fullmatch(name)
                if m is not None:
                    targets.append(Target(rn.target.expand(_match_groups(m)), (name,), 0, 1, _lead(shape), rn.rule))
                    break
            else:
                if self.unmatched == "error":
                    raise self.fail(f"no rule matches tensor {name!r} (the rule file says unmatched: error)")
                if self.unmatched == "keep":
                    targets.append(Target(name, (name,), 0, 1, _lead(shape), "unmatched"))
        order = {n: i for i, n in enumerate(shapes)}
        targets.sort(key=lambda t: order[t.sources[0]])  # the folder's order, fused or not
        seen: dict[str, str] = {}
        for t in targets:
            if t.name in seen:
                raise self.fail(f"two tensors map to parameter {t.name!r} (by {seen[t.name]} and {t.rule})", t.rule)
            seen[t.name] = t.rule
        return targets

    def _fused(self, fu: Fusion, name: str, sources: list[str], shapes: list[tuple[int, ...]],
               config: Mapping[str, Any]) -> Target:
        ndim = len(shapes[0])
        if not 0 <= fu.axis < max(ndim, 1) or any(len(s) != ndim for s in shapes):
            raise self.fail(f"sources {sources} of shapes {[list(s) for s in shapes]} cannot be joined along "
                            f"axis {fu.axis}", fu.rule)
        rest = {s[:fu.axis] + s[fu.axis + 1:] for s in shapes}
        if len(rest) > 1:
            raise self.fail(f"sources {sources} of shapes {[list(s) for s in shapes]} differ off axis {fu.axis}",
                            fu.rule)
        sizes = tuple(s[fu.axis] for s in shapes)
        groups = self._groups(fu, sizes, config, sources)
        try:
            fused_segments(sizes, groups)
        except ValueError as e:
            raise self.fail(f"{name!r}: {e}", fu.rule) from None
        return Target(name, tuple(sources), fu.axis, groups, sizes, fu.rule)

    def _groups(self, fu: Fusion, sizes: tuple[int, ...], config: Mapping[str, Any], sources: list[str]) -> int:
        if fu.interleave == "blocked":
            return self.value(fu, "blocks", config, default=1)
        if fu.interleave == "interleaved-rows":
            if len(set(sizes)) > 1:
                raise self.fail(f"interleaved-rows needs sources of one length along the axis; {sources} have "
                                f"{list(sizes)}", fu.rule)
            return sizes[0]
        heads = self.value(fu, "num_heads", config)
        kv = self.value(fu, "num_kv_heads", config, default=heads)
        if len(sizes) != 3:
            raise self.fail(f"qkv-groups fuses three sources (q, k, v), not {len(sizes)}", fu.rule)
        if not heads or not kv or heads % kv:
            raise self.fail(f"num_heads {heads} is not a multiple of num_kv_heads {kv}", fu.rule)
        head_dim = self.value(fu, "head_dim", config, default=sizes[0] // heads if sizes[0] % heads == 0 else 0)
        want = (heads * head_dim, kv * head_dim, kv * head_dim)
        if not head_dim or sizes != want:
            raise self.fail(f"q, k, v of lengths {list(sizes)} do not fit {heads} heads, {kv} KV heads of "
                            f"head_dim {head_dim} (want {list(want)})", fu.rule)
        return kv

    def value(self, fu: Fusion, field: str, config: Mapping[str, Any], default: int | None = None) -> int:
        """A fusion's integer setting: as written, or looked up in ``config`` by key."""
        v = getattr(fu, field)
        if v is None:
            if default is None:
                raise self.fail(f"'{field}' is needed", fu.rule)
            return default
        if isinstance(v, str):
            for key in v.split("|"):
                found = config.get(key)
                if type(found) is int and found > 0:
                    return found
            if default is not None:
                return default
            raise self.fail(f"'{field}' names config key(s) {v!r}, which the model's config.json does not have as a "
                            "positive integer", fu.rule)
        return v

    # ---- backward: store names -> Hugging Face names

    def reverse(self, shapes: Mapping[str, Sequence[int]], config: Mapping[str, Any] | None = None) -> list[Target]:
        """The Hugging Face tensors an export writes from store parameters ``shapes``: one
        :class:`Target` per store parameter whose ``name`` is the store's and ``sources`` the
        Hugging Face names, in the order the forward rule joined them.

        A fused parameter is split in the groups its rule says; the sources' lengths come from
        the head counts (``qkv-groups``; ``blocked`` with head counts) or are equal. A parameter
        no rule reads back is kept under its name (``unmatched: keep``), dropped or refused.
        """
        config = config or {}
        self._check_lengths(shapes, "parameter")
        out: list[Target] = []
        for name, shape in shapes.items():
            found = self._reverse_one(name, tuple(shape), config)
            if found is not None:
                out.append(found)
            elif self.unmatched == "keep":
                out.append(Target(name, (name,), 0, 1, _lead(tuple(shape)), "unmatched"))
            elif self.unmatched == "error":
                raise self.fail(f"no rule reads parameter {name!r} back (the rule file says unmatched: error)")
        seen: dict[str, str] = {}
        for t in out:
            for s in t.sources:
                if s in seen:
                    raise self.fail(f"parameters {seen[s]!r} and {t.name!r} both export as {s!r}", t.rule)
                seen[s] = t.name
        return out

    def _reverse_one(self, name: str, shape: tuple[int, ...], config: Mapping[str, Any]) -> Target | None:
        for fu in self.fusions:
            groups = self._read_back(fu, name)
            if groups is None:
                continue
            sources = [t.expand(groups) for t in fu.sources]
            if not 0 <= fu.axis < len(shape):
                raise self.fail(f"parameter {name!r} of shape {list(shape)} has no axis {fu.axis}", fu.rule)
            sizes = self._split_sizes(fu, shape[fu.axis], config, name)
            return Target(name, tuple(sources), fu.axis, self._groups(fu, sizes, config, sources), sizes, fu.rule)
        for rn in self.renames:
            groups = self._read_back(rn, name)
            if groups is not None and rn.reverse is not None:
                return Target(name, (rn.reverse.template.expand(groups),), 0, 1, _lead(shape), rn.rule)
        return None

    def _read_back(self, rule: Rename | Fusion, name: str) -> dict[int, str] | None:
        if rule.reverse is None:
            # a rule that cannot be read back is an error only when it could have made this name
            if _could_make(rule.target, name):
                raise self.fail(f"parameter {name!r} looks like this rule's target, but its pattern is not "
                                "literal text and groups: give it a 'reverse' to export", rule.rule)
            return None
        groups = rule.reverse.groups(name)
        if groups is None:
            return None
        source = rule.reverse.template.expand(groups)
        m = rule.pattern.fullmatch(source)
        if m is None or rule.target.expand(_match_groups(m)) != name:
            return None  # the forward rule would not make this name from that source: not this rule's
        return _match_groups(m)

    def _split_sizes(self, fu: Fusion, total: int, config: Mapping[str, Any], name: str) -> tuple[int, ...]:
        n = len(fu.sources)
        if fu.num_heads is not None and n == 3:
            heads = self.value(fu, "num_heads", config)
            kv = self.value(fu, "num_kv_heads", config, default=heads)
            if total % (heads + 2 * kv):
                raise self.fail(f"parameter {name!r} has {total} rows, not a multiple of num_heads + 2*num_kv_heads "
                                f"= {heads + 2 * kv}", fu.rule)
            hd = total // (heads + 2 * kv)
            return (heads * hd, kv * hd, kv * hd)
        if total % n:
            raise self.fail(f"parameter {name!r} has {total} rows along axis {fu.axis}, which do not split into "
                            f"{n} equal sources", fu.rule)
        return (total // n,) * n


def _could_make(t: Template, name: str) -> bool:
    rx = "".join(re.escape(p) if isinstance(p, str) else ".+" for p in t.parts)
    return re.fullmatch(rx, name) is not None


def _lead(shape: Sequence[int]) -> tuple[int, ...]:
    return (shape[0],) if len(shape) else (1,)


def _match_groups(m: re.Match[str]) -> dict[int, str]:
    return {i: (g or "") for i, g in enumerate(m.groups(), 1)}


# --- parsing ----------------------------------------------------------------------------------------

def parse_name_map(doc: Any, path: str) -> NameMap:
    """Validate a rule file's JSON ``doc`` (read from ``path``, which errors name)."""
    def top(problem: str) -> NameMapError:
        return NameMapError(problem, path=path)

    if not isinstance(doc, Mapping):
        raise top("the rule file is not a JSON object")
    unknown = set(doc) - _TOP_KEYS
    if unknown:
        raise top(f"unknown key(s) {sorted(unknown)}; a rule file has {sorted(_TOP_KEYS)}")
    if doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise top(f"not a name map: it needs \"format\": \"{FORMAT}\" and \"version\": {VERSION}")
    unmatched = doc.get("unmatched", "keep")
    if unmatched not in UNMATCHED:
        raise top(f"'unmatched' is {unmatched!r}, not one of {', '.join(UNMATCHED)}")
    description = doc.get("description", "")
    if not isinstance(description, str):
        raise top("'description' is not a string")
    lists = {}
    for key in ("renames", "fusions"):
        v = doc.get(key, [])
        if not isinstance(v, list) or len(v) > MAX_RULES:
            raise top(f"'{key}' is not a list of at most {MAX_RULES} rules")
        lists[key] = v
    renames = tuple(_rename(r, f"renames[{i}]", path) for i, r in enumerate(lists["renames"]))
    fusions = tuple(_fusion(r, f"fusions[{i}]", path) for i, r in enumerate(lists["fusions"]))
    tp = _tensor_parallel(doc["tensor_parallel"], path) if "tensor_parallel" in doc else None
    return NameMap(path, renames, fusions, unmatched, description, tp)


def _tensor_parallel(doc: Any, path: str) -> TensorParallel:
    fail = _rule_fail(path, "tensor_parallel")
    if not isinstance(doc, Mapping) or set(doc) - _TP_KEYS:
        raise fail(f"'tensor_parallel' must be an object with keys among {sorted(_TP_KEYS - {'comment'})}")
    lists = []
    for key in ("split_rows", "split_columns", "first_stage"):
        v = doc.get(key, [])
        if not isinstance(v, list) or len(v) > MAX_RULES:
            raise fail(f"'{key}' is not a list of at most {MAX_RULES} patterns")
        lists.append(tuple(_compile(p, fail, f"{key}[{i}]") for i, p in enumerate(v)))
    return TensorParallel(*lists)


def _rule_fail(path: str, rule: str) -> Callable[[str], NameMapError]:
    return lambda problem: NameMapError(problem, path=path, rule=rule)


def _rule_head(r: Any, rule: str, path: str, keys: set[str],
               what: str) -> tuple[Callable[[str], NameMapError], re.Pattern[str], Template]:
    """What every rule has: a JSON object of known keys, a ``pattern`` and a ``target`` that refers
    only to its groups; returns the rule's error maker, the compiled pattern and the target."""
    fail = _rule_fail(path, rule)
    if not isinstance(r, Mapping):
        raise fail("the rule is not a JSON object")
    unknown = set(r) - keys
    if unknown:
        raise fail(f"unknown key(s) {sorted(unknown)}; a {what} has {sorted(set(keys) - {'comment'})}")
    pattern = _compile(r.get("pattern"), fail)
    target = _template(r.get("target"), fail, "target")
    _check_refs(target, pattern, fail, "target")
    return fail, pattern, target


def _rename(r: Any, rule: str, path: str) -> Rename:
    fail, pattern, target = _rule_head(r, rule, path, _RENAME_KEYS, "rename")
    return Rename(rule, pattern, target, _reverse_of(pattern.pattern, target, r.get("reverse"), fail))


def _fusion(r: Any, rule: str, path: str) -> Fusion:
    fail, pattern, target = _rule_head(r, rule, path, _FUSION_KEYS, "fusion")
    raw = r.get("sources")
    if not isinstance(raw, list) or not 2 <= len(raw) <= MAX_SOURCES:
        raise fail(f"'sources' is not a list of 2 to {MAX_SOURCES} name templates")
    sources = tuple(_template(s, fail, f"sources[{i}]") for i, s in enumerate(raw))
    for i, s in enumerate(sources):
        _check_refs(s, pattern, fail, f"sources[{i}]")
    if len({s.parts for s in sources}) != len(sources):
        raise fail("'sources' names one tensor twice")
    axis = r.get("axis", 0)
    if type(axis) is not int or not 0 <= axis < 64:
        raise fail(f"'axis' is {axis!r}, not an integer in 0..63")
    mode = r.get("interleave", "blocked")
    if mode not in MODES:
        raise fail(f"'interleave' is {mode!r}, not one of {', '.join(MODES)}")
    values = {k: _value(r.get(k), fail, k) for k in ("blocks", "num_heads", "num_kv_heads", "head_dim")}
    if mode == "qkv-groups" and (len(sources) != 3 or values["num_heads"] is None):
        raise fail("qkv-groups needs three sources (q, k, v) and num_heads (num_kv_heads defaults to it)")
    if mode != "blocked" and values["blocks"] is not None:
        raise fail(f"'blocks' applies to interleave 'blocked', not {mode!r}")
    rev = _reverse_of(pattern.pattern, target, r.get("reverse"), fail)
    if rev is not None and not all(s.refs <= set(range(1, pattern.groups + 1)) for s in sources):
        rev = None
    return Fusion(rule, pattern, sources, target, axis, mode, reverse=rev, **values)


def _value(v: Any, fail: Any, what: str) -> Value:
    if v is None:
        return None
    if type(v) is int and 0 < v < (1 << 40):
        return v
    if isinstance(v, str) and v and len(v) <= 256:
        return v
    raise fail(f"'{what}' is {v!r}: a positive integer or the name of a config.json key")


def _check_refs(t: Template, pattern: re.Pattern[str], fail: Any, what: str) -> None:
    if t.refs and max(t.refs) > pattern.groups:
        raise fail(f"'{what}' refers to group {max(t.refs)}, but the pattern has {pattern.groups}")


def shipped_name_maps() -> list[str]:
    """The names of the rule sets that come with ckptstore (``--name-map llama``)."""
    folder = resources.files(__package__).joinpath(_SHIPPED)
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def load_name_map(spec: str | os.PathLike[str] | Mapping[str, Any]) -> NameMap:
    """A rule set: a shipped one by name (:func:`shipped_name_maps`), a rule file's path, or its
    parsed JSON. Raises :class:`NameMapError` naming the file for anything malformed."""
    if isinstance(spec, Mapping):
        return parse_name_map(spec, "<rules>")
    text = os.fspath(spec)
    if text in shipped_name_maps():
        raw = resources.files(__package__).joinpath(_SHIPPED).joinpath(text + ".json").read_bytes()
        where = f"{text} (shipped)"
    else:
        try:
            with open(text, "rb") as f:
                raw = f.read(MAX_RULE_FILE_BYTES + 1)
        except OSError as e:
            raise NameMapError(f"cannot read it ({e.strerror or e}); a name map is "
                               f"{' | '.join(shipped_name_maps())} or a rule file", path=text) from None
        where = text
        if len(raw) > MAX_RULE_FILE_BYTES:
            raise NameMapError(f"the rule file is larger than {MAX_RULE_FILE_BYTES} bytes", path=text)
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise NameMapError(f"not valid JSON: {e}", path=where) from None
    return parse_name_map(doc, where)


__all__ = ["Fusion", "NameMap", "Rename", "Target", "Template", "fused_segments", "load_name_map", "parse_name_map",
           "segment_gcd", "shipped_name_maps"]
