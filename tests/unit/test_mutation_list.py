"""The mutation suite's list (tests/mutants/mutations.toml) stays applicable: every mutation still
finds its function and pattern in the tree, names tests that exist, and is listed in the README's
"Proofs and mutations" table with the test that kills it. A mutation that no longer applies fails
here (in seconds) until it is updated; ``make mutants`` runs them all."""

from __future__ import annotations

import re

import pytest

from tests.mutants.run import LIST, ROOT, Mutation, apply, load, locate

MUTATIONS = load()


def test_the_list_holds_at_least_25_mutations_with_a_fast_subset() -> None:
    assert len(MUTATIONS) >= 25
    assert 5 <= sum(m.fast for m in MUTATIONS) <= 15  # make test runs the fast ones (<= ~3 min)


@pytest.mark.parametrize("m", MUTATIONS, ids=[m.id for m in MUTATIONS])
def test_each_mutation_still_applies_and_names_tests_that_exist(m: Mutation) -> None:
    # Given the tree as it is, when the mutation is located, then it applies exactly as written
    assert locate(m) == "", f"{LIST.name}: mutation {m.id!r} no longer applies; update it"
    # And each test it names exists
    for node in m.tests:
        path, _, name = node.partition("::")
        source = (ROOT / path).read_text()
        assert re.search(rf"^def {re.escape(name.split('[')[0])}\(", source, re.MULTILINE), node


def test_each_mutation_is_in_the_readme_with_the_test_that_kills_it() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Proofs and mutations") :]
    for m in MUTATIONS:
        row = next((line for line in section.splitlines() if line.startswith(f"| `{m.id}` |")), None)
        assert row is not None, f"README: no row for mutation {m.id}"
        assert m.tests[0].split("::")[-1] in row, f"README row of {m.id} must name {m.tests[0]}"


def test_a_mutation_that_no_longer_matches_is_not_located() -> None:
    # Given a mutation whose pattern is gone from its function, and one naming a function that is gone
    base = MUTATIONS[0]
    gone = Mutation(**{**base.__dict__, "find": "no such code anywhere"})
    moved = Mutation(**{**base.__dict__, "function": "no_such_function"})
    source = (ROOT / base.file).read_text()
    # When / Then neither applies, and says why
    assert apply(gone, source)[0] is None and "matched 0 time(s)" in apply(gone, source)[1]
    assert apply(moved, source)[0] is None and "no single definition" in apply(moved, source)[1]
