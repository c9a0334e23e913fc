"""The store split of the process tests (tests/store_split.py): make test runs each on one store,
make chaos the other, and the choice spreads over both."""

from __future__ import annotations

from tests.store_split import STORES, kept_store


def test_both_variants_of_a_test_agree_on_the_one_store_make_test_keeps() -> None:
    # Given a process test's two variants, alone and among other parameters
    for nodeid in (
        "tests/process/test_cli.py::test_x[{}]",
        "tests/process/test_file_effects.py::test_y[{}-exif]",
    ):
        # When each asks which store make test keeps
        kept = {kept_store(nodeid.format(store), store) for store in STORES}
        # Then both name the same one
        assert len(kept) == 1, (nodeid, kept)


def test_the_kept_stores_spread_over_both() -> None:
    # Given forty tests of one file
    ids = [f"tests/process/test_cli.py::test_{n}[sqlite]" for n in range(40)]
    # When the kept store of each is chosen
    kept = [kept_store(i, "sqlite") for i in ids]
    # Then both stores keep some of them
    assert set(kept) == set(STORES)
