"""Messages as data (`ms_accum._validation.Message`): a template's fields are argument references (``{@name}``) or
values (``{name}``, ``{name=}``), told apart by their form; a template whose fields and values do not match is refused
as the message is built, a bug found here rather than by a user; and every template of the package fits the values its
raise site gives, and renders, in the library's words and in the command line's; and no error of the package is written
by hand (a builtin exception of a string, a ``For '...'`` prefix outside the renderer, a template that only passes text
through)."""
import builtins
import ast
import json
import pathlib
import string

import pytest

import ms_accum
from ms_accum import cli
from ms_accum._validation import (LIBRARY, Argument, ArgumentValueError, Aside, Message, NoBatchError, Setting, as_data,
                                  from_data)
from ms_accum.train.checkpoint import CheckpointError
from ms_accum.train.resume import Layout
from ms_accum.cli.errors import CliWords
from conftest import raises_exactly

PACKAGE = pathlib.Path(ms_accum.__file__).parent
K = "{@k_max:subject} must be at least {@k_min} ({k_min}), but got {k_max}."


def words(*argv):
    """The command line's words for `argv`, as `ms-accum` parses it."""
    return CliWords(cli.build_parser().parse_args(list(argv)))


def test_a_field_s_form_says_whether_it_names_an_argument_or_holds_a_value():
    """``{@k_min}`` is the argument, ``{k_min}`` its value: no suffix tells them apart."""
    message = Message(K + " {@k_min:plain}, {lr_rule=}, {batch:subject}: {@skip_outliers} must {_none}.", k_min=4,
                      k_max=2, lr_rule="sqrt", batch=Argument("batch_size"))
    assert message.render() == ("the argument 'k_max' must be at least 'k_min' (4), but got 2. k_min, lr_rule='sqrt', "
                                "the argument 'batch_size': 'skip_outliers' must be None.")
    assert message.render(words("train")) == (
        "the argument '--adaptive-k' must be at least '--adaptive-k' (4), but got 2. --adaptive-k, --lr-rule sqrt, the "
        "argument '--batch-size': '--skip-outliers' must not be given.")
    assert message.arguments == ("k_max", "k_min", "lr_rule", "batch_size", "skip_outliers")
    assert Message("{given} was asked for", given=Setting("model", "mlp")).render(words("eval", "--ckpt", "x")) == (
        "--model mlp was asked for")


@pytest.mark.parametrize("template, values, refusal", [
    (K, {"k_min": 4}, "fields without a value: k_max"),
    (K, {"k_min": 4, "k_max": 2, "k_max2": 2}, "values no field uses: k_max2"),
    ("{@k_max:subject} must be at least {k_min}.", {}, "fields without a value: k_min"),  # a misspelt reference
    ("{@k_max:name} or {@k_min!r}, {k_min=!r}", {"k_min": 4}, "fields of no known form: '@k_max', '@k_min', "
                                                              "'k_min='; values no field uses: k_min"),
    ("{} and {0} and {plan.ranks}", {"plan": 1}, "fields of no known form: '', '0', 'plan.ranks'; values no field "
                                                 "uses: plan"),
])
def test_a_template_that_does_not_fit_its_values_is_refused_as_the_message_is_built(template, values, refusal):
    with raises_exactly(TypeError, f"The message template {template!r} does not fit its values: {refusal}."):
        ArgumentValueError(template, **values)


def test_a_template_that_does_not_parse_is_refused():
    with raises_exactly(TypeError, "The message template 'got {k_max' does not parse: expected '}' before end of "
                                   "string."):
        Message("got {k_max")


def test_an_error_crosses_a_process_boundary_as_json_whole():
    """A plan's trial sends its error as JSON data (`as_data`), rebuilt from its class and state, not its bare template:
    the same text in the library's words and the command line's, the same kinds of values inside."""
    def crossed(error):
        return from_data(json.loads(json.dumps(as_data(error))))
    error = crossed(ArgumentValueError(K, k_min=4, k_max=2).named("AdaptiveK"))
    assert str(error) == "For 'AdaptiveK', the argument 'k_max' must be at least 'k_min' (4), but got 2."
    assert isinstance(error, ValueError) and error.arguments == ("k_max", "k_min") and error.final
    no_batch = crossed(NoBatchError("no batch of {batch}", 3, batch=8))
    assert (str(no_batch), no_batch.samples) == ("no batch of 8", 3)
    sent = CheckpointError("{arg:subject}, {set}{aside}: {layout} {inner} {options} {pair}", arg=Argument("mini_steps"),
                           set=Setting("batch_size", 4), aside=Aside(" (a remark)"), layout=Layout(2, 4, 1),
                           inner=Message("{@k_min}"), options=["a"], pair=("b", 1))
    flags = words("train", "--accumulate-step", "2")
    assert crossed(sent).render(flags) == sent.render(flags) and str(crossed(sent)) == str(sent)
    assert type(crossed(sent).values["layout"]) is Layout and crossed(sent).values["pair"] == ("b", 1)
    with pytest.raises(TypeError, match="object is not message data"):
        as_data(ArgumentValueError("{value}", value=object()))
    with pytest.raises(TypeError, match="json.JSONDecoder is not a kind of message data"):
        from_data({"kind": ["json", "JSONDecoder", {"tuple": []}, {"dict": []}]})


def test_the_command_line_names_each_argument_by_the_flag_its_parser_adds():
    """The flags come from the parser: a flag whose destination is not the library's name says which names it sets."""
    assert {name: cli.FLAGS[name] for name in ("accumulate_step", "mini_steps", "epoch", "k_min", "k_max", "logdir",
                                               "format", "directory", "data_seed", "global_batch")} == {
        "accumulate_step": "--accumulate-step", "mini_steps": "--accumulate-step", "epoch": "--epochs",
        "k_min": "--adaptive-k", "k_max": "--adaptive-k", "logdir": "--tensorboard", "format": "--ckpt-format",
        "directory": "--ckpt-dir", "data_seed": "--seed", "global_batch": "--global-batch"}
    batch = Message("{@batch_size:subject}")
    assert batch.render(words("train")) == "the argument '--batch-size'"
    assert batch.render(words("eval", "--ckpt", "x")) == "the argument '--eval-batch-size'"  # eval's own flag


# --- Every template of the package. ---

# Raise sites whose template or values are known only at run time, with why; the construction check still sees them.
DYNAMIC = {
    ("cli/job.py", "apply_plan"): "the flags that set K besides the one given, joined by 'or', as argument fields",
}
# Keywords a class takes for itself, not as a message value.
OWN = {"NoBatchError": {"samples"}, "CliError": {"summary"}}


def message_classes() -> set:
    """`Message` and every class of the package derived from it, by name."""
    bases = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = {getattr(base, "id", getattr(base, "attr", None)) for base in node.bases}
    found = {"Message"}
    while True:
        more = {name for name, of in bases.items() if of & found} - found
        if not more:
            return found
        found |= more


def raise_sites():
    """Each call of a message class in the package: (file, enclosing function, class, the call)."""
    classes = message_classes()
    for path in sorted(PACKAGE.rglob("*.py")):
        def visit(node, function):
            for child in ast.iter_child_nodes(node):
                inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
                if isinstance(child, ast.Call) and getattr(child.func, "id", None) in classes:
                    yield str(path.relative_to(PACKAGE)), inner, child.func.id, child
                yield from visit(child, inner)
        yield from visit(ast.parse(path.read_text(encoding="utf-8")), "<module>")


class Placeholder:
    """A value of a template's field, whatever it is: formats under any spec a number takes."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __format__(self, spec: str) -> str:
        return format(7, spec) if spec else f"<{self.key}>"

    def __repr__(self) -> str:
        return f"<{self.key}!r>"


def placeholder(keyword: ast.keyword):
    """A stand-in for the value a raise site gives: an `Argument` or `Setting` as the site builds one, else any."""
    made = getattr(getattr(keyword.value, "func", None), "id", None)
    if made == "Argument":
        return Argument("batch_size")
    if made == "Setting":
        return Setting("batch_size", 8)
    return Placeholder(keyword.arg)


def test_every_template_of_the_package_fits_its_values_and_renders():
    sites, dynamic = [], set()
    for path, function, kind, call in raise_sites():
        literal = bool(call.args) and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)
        if (path, function) in DYNAMIC:
            dynamic.add((path, function))
            continue
        where = f"{path}:{call.lineno} ({function})"
        assert literal and all(keyword.arg for keyword in call.keywords), f"{where}: known only at run time"
        template = call.args[0].value
        own = OWN.get(kind, set())
        values = {keyword.arg: placeholder(keyword) for keyword in call.keywords if keyword.arg not in own}
        fields = {field.rstrip("=") for _, field, _, _ in string.Formatter().parse(template)
                  if field is not None and not field.startswith(("@", "_"))}
        assert fields == set(values), (where, template, fields ^ set(values))
        message = Message(template, **values)  # the check the class runs as it is built
        for reader in (LIBRARY, words("train"), words("train", "--model", "users_model:build")):
            assert message.render(reader), where
        sites.append(where)
    assert len(sites) > 150, sites  # the walk found the package's messages
    assert dynamic == set(DYNAMIC), "a listed exception no longer exists"


# --- No error written by hand. ---

# Exceptions built from a string on purpose, by (file, class), with why.
HAND_WRITTEN = {
    ("_validation.py", "TypeError"): "the message machinery refusing a template: a bug in ms_accum, which no template "
                                     "can say",
    ("_mindspore.py", "AttributeError"): "a module's __getattr__: Python's own words, which hasattr and imports expect",
    ("deprecation.py", "AttributeError"): "a removed name, in Python's own words for a missing one and the table's "
                                          "line",
    ("deprecation.py", "TypeError"): "a removed keyword, in Python's own words for an unexpected one and the table's "
                                     "line",
    ("deprecation.py", "RuntimeError"): "a table entry past its removal: a maintainer's bug, found at import",
    ("deprecation.py", "KeyError"): "ms_accum asking the table for a module it does not list: a bug",
}
# Where the caller's name is put in front of a message (``For 'X', ``): the renderers, nowhere else.
RENDERERS = {("_validation.py", "__str__"), ("cli/errors.py", "error_line")}
EXCEPTIONS = {name for name, value in vars(builtins).items()
              if isinstance(value, type) and issubclass(value, BaseException) and not issubclass(value, Warning)}


def package_nodes():
    """Each node of the package's modules but their docstrings: (file, enclosing function, node)."""
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}

        def visit(node, function):
            for child in ast.iter_child_nodes(node):
                inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
                if id(child) not in docstrings:
                    yield str(path.relative_to(PACKAGE).as_posix()), inner, child
                    yield from visit(child, inner)
        yield from visit(tree, "<module>")


def is_text(node: ast.AST) -> bool:
    """Whether `node` builds a string in place: a literal, an f-string, a sum or a ``%`` of them, a ``.format``."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp):
        return is_text(node.left) or is_text(node.right)
    return isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "format" and is_text(node.func.value)


def hand_written():
    """Each place the package writes an error by hand, with what is wrong with it."""
    messages, own = message_classes(), set()
    for path in PACKAGE.rglob("*.py"):  # the package's exception classes that are not messages
        own |= {node.name for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                if isinstance(node, ast.ClassDef) and node.name.endswith(("Error", "Exception"))}
    for path, function, node in package_nodes():
        where = f"{path}:{getattr(node, 'lineno', '?')} ({function})"
        if isinstance(node, ast.Call):
            kind = getattr(node.func, "id", getattr(node.func, "attr", None))
            if (kind in EXCEPTIONS or kind in own or kind in ("ArgumentTypeError", "ArgumentError")) \
                    and kind not in messages and any(map(is_text, node.args)):
                yield where, kind, "an exception built from a string"
            elif kind in messages and node.args and isinstance(node.args[0], ast.Constant) and is_text(node.args[0]):
                parts = list(string.Formatter().parse(node.args[0].value))
                fields = [field for _, field, _, _ in parts if field is not None]
                words = "".join(text for text, _, _, _ in parts)
                if len(fields) == 1 and not fields[0].startswith(("@", "_")) and not fields[0].endswith("=") \
                        and not any(map(str.isalpha, words)):
                    yield where, kind, "a template that only passes text through"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "For '" in node.value \
                and (path, function) not in RENDERERS:
            yield where, None, "a caller's name written by hand"


def test_no_error_of_the_package_is_written_by_hand():
    found = list(hand_written())
    listed = {(where.partition(":")[0], kind) for where, kind, _ in found}
    assert [site for site in found if (site[0].partition(":")[0], site[1]) not in HAND_WRITTEN] == []
    assert listed >= set(HAND_WRITTEN), f"no longer written by hand: {set(HAND_WRITTEN) - listed}"
