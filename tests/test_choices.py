"""The value sets config fields accept, read from the registries' source without importing them
(utils/core/choices.py): they agree with the imported registries, and a registry written so that
they cannot be read is refused, naming its file and line."""
import pytest

from utils.core.config import CONFIG_DIR


def test_choice_lists_agree_with_the_registries():
    """Read from the registries' source (utils/core/choices.py registry_names), so they agree unless
    the reader is wrong: this checks the reader against the imported registries."""
    from utils.agent.engines import ENGINES
    from utils.core import choices as schema
    from utils.core.methods import METHODS
    from utils.data.adapters import ADAPTERS
    from utils.reward.scorers import SCORERS
    from utils.train.lora_fast import FORWARDS
    from utils.agent.retrieval import RETRIEVERS
    from utils.data.trace_sources import TRACE_SOURCES
    from utils.train.losses import ADVANTAGES, AGGREGATIONS, POLICY_LOSSES
    from utils.train.sft_weights import SFT_WEIGHTINGS

    assert set(schema.ENGINE_NAMES) == set(ENGINES)
    assert set(schema.LORA_FORWARDS) == set(FORWARDS)
    assert set(schema.LOSS_AGGS) == set(AGGREGATIONS)
    assert set(schema.ADV_SCALINGS) == set(ADVANTAGES)
    assert set(schema.POLICY_LOSS_NAMES) == set(POLICY_LOSSES)
    from utils.core.choices import POLICY_LOSS_LEVELS
    assert POLICY_LOSS_LEVELS == {name: level for name, (_, level) in POLICY_LOSSES.items()}
    assert set(schema.SCORER_NAMES) == set(SCORERS)
    assert set(schema.ADAPTER_NAMES) == set(ADAPTERS)
    assert set(schema.RETRIEVER_NAMES) == {"none", *RETRIEVERS}
    assert set(schema.TRACE_SOURCE_NAMES) == set(TRACE_SOURCES)
    assert set(schema.SFT_WEIGHTINGS) == set(SFT_WEIGHTINGS)
    algorithms = {p.stem for p in (CONFIG_DIR / "algorithms").glob("*.yaml")}
    assert algorithms == set(METHODS)


def test_a_registry_the_schema_cannot_read_is_refused_naming_its_file(tmp_path):
    from utils.core.choices import registry_names

    (tmp_path / "m.py").write_text('A = Registry("x", {"a": 1, "b": 2})\n'
                                   'B = Registry("y", {k.name: k for k in (K("c"), K("d"))})\n'
                                   'C = Registry("z", dict(a=1))\n'
                                   'D = Registry("w", {NAME: 1})\n')
    assert registry_names("m.py", "A", tmp_path) == ("a", "b")
    assert registry_names("m.py", "B", tmp_path) == ("c", "d")
    for variable in ("C", "D"):
        with pytest.raises(ValueError, match=f"m.py:\\d+: {variable} must be Registry"):
            registry_names("m.py", variable, tmp_path)
    with pytest.raises(ValueError, match="m.py: no top-level assignment to E"):
        registry_names("m.py", "E", tmp_path)


def test_a_registry_levels_are_read_from_its_source_or_refused(tmp_path):
    from utils.core.choices import registry_levels

    (tmp_path / "m.py").write_text('A = Registry("x", {"a": (f, "token"), "b": (g, "sequence")})\n'
                                   'B = Registry("y", {"a": (f, "token"), "b": g})\n')
    assert registry_levels("m.py", "A", tmp_path) == {"a": "token", "b": "sequence"}
    with pytest.raises(ValueError, match="m.py:2: every entry of B must be"):
        registry_levels("m.py", "B", tmp_path)


def test_the_method_table_and_each_trainers_list_come_from_the_registry():
    """`python -m utils.core.methods` and 05/06's --help name the methods from METHODS alone: each
    method in one trainer's list, the one its flags say (an SFT term: 05), and one table line each."""
    from utils.core.methods import METHODS, RL_TRAINER, SFT_TRAINER, table, trained_by

    sft, rl = trained_by(SFT_TRAINER), trained_by(RL_TRAINER)
    assert sorted(sft + rl) == sorted(METHODS) and not set(sft) & set(rl)
    assert "red" in sft and "grpo" in rl and all(METHODS[m].flags["sft"] for m in sft)
    lines = table()
    assert [line.split()[0] for line in lines[1:]] == list(METHODS)
    assert all(METHODS[line.split()[0]].trainer == line.split()[1] for line in lines[1:])
