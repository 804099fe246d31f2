"""Entry file names: whose they are, and which the sweep may remove."""

from __future__ import annotations

from surge.weights.segments import Owner, entry_name, orphans, owner_of, partial_name


def test_names_say_their_owner_and_only_surge_names_parse() -> None:
    owner = Owner(1234, 98765)
    name = entry_name(owner, "ab" * 32, "llama 8b/../x.safetensors")
    assert name == f"surge-weights.1234.98765.{'ab' * 16}.llama_8b_x_safetensors"
    assert owner_of(name) == owner and owner_of(partial_name(owner, 3)) == owner
    for foreign in ("other", "surge-weights.x.1.k", "surge-weights.1.x.k", "surge-weights.1.2",
                    "surge-weightsX.1.2.k"):
        assert owner_of(foreign) is None


def test_orphans_are_the_files_of_owners_that_no_longer_run() -> None:
    live, dead = Owner(10, 1), Owner(11, 1)
    recycled = Owner(10, 2)  # pid 10 again, but another process: its start time differs
    names = [entry_name(live, "a" * 64, "m"), entry_name(dead, "b" * 64, "m"),
             partial_name(dead, 1), entry_name(recycled, "c" * 64, "m"), "unrelated"]
    asked: list[Owner] = []

    def alive(owner: Owner) -> bool:
        asked.append(owner)
        return owner == live

    assert orphans(names, alive) == sorted(names[1:4])
    assert sorted(asked, key=lambda o: (o.pid, o.start)) == [live, recycled, dead]  # once each


def test_this_process_is_alive_and_a_made_up_one_is_not() -> None:
    me = Owner.this_process()
    assert me.alive() and not Owner(me.pid, me.start + 1).alive()
