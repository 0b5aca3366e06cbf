"""The .pyi stub agrees with the compiled module: Planner's keywords and defaults are the
option table's, and every public name the stub declares exists."""
import ast
import pathlib

import dynapipe

STUB = pathlib.Path(dynapipe.__file__).with_name("_dynapipe.pyi")


def stub_tree():
    return ast.parse(STUB.read_text())


def test_planner_keywords_and_defaults_match_the_option_table():
    tree = stub_tree()
    planner = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Planner")
    init = next(n for n in planner.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    names = [a.arg for a in init.args.kwonlyargs]
    defaults = [ast.literal_eval(d) for d in init.args.kw_defaults]
    table = dynapipe.plan_options()
    assert names == [row["name"] for row in table]
    assert defaults == [row["default"] for row in table]


def test_stub_names_exist():
    for node in stub_tree().body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            assert hasattr(dynapipe, node.name), node.name
            if isinstance(node, ast.ClassDef):
                for member in node.body:
                    if isinstance(member, ast.FunctionDef) and not member.name.startswith("_"):
                        assert hasattr(getattr(dynapipe, node.name), member.name), (node.name, member.name)


def test_public_objects_have_docstrings():
    for name in ["Planner", "IterationPlan", "MicroBatch", "Instruction", "ExecutionPlan",
                 "Samples", "GlobalBatch", "load_samples", "plan_options", "simulate", "Error"]:
        assert getattr(dynapipe, name).__doc__, name
    assert dynapipe.Planner.plan.__doc__ and "GIL" in dynapipe.Planner.plan.__doc__
