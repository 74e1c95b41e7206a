"""A DFlash2 drafter's candidates are its reference's (issue 46): a low-bit tied head preselects at
int8 activations and re-ranks in fp32; low-bit drafter layers or a low-bit untied head run at fp32
activations; parity wants every row's candidate set and names the row that differs."""

import json
import shutil

import numpy as np
import pytest

from dflash_edge.export import parity
from dflash_edge.export.dflash2_drafter import PRESELECT, needs_fp32_activations, weight_format
from dflash_edge.export.weight_format import WeightFormat

from dflash2_fixture import write_dflash2
from runtime_cases import PROMPTS

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tied_int4(tiny_checkpoints, tmp_path_factory):
    """An int4 bundle of the tiny tied-head qwen2 target + a block-8 DFlash2 drafter (its own
    layers fp32, export's default beside an int4 target)."""
    from dflash_edge.export.exporter import ExportOptions, export_bundle
    from dflash_edge.models.config import TargetConfig

    from fixtures_bundle import MAX_CONTEXT, PREFILL_CHUNK

    root = tmp_path_factory.mktemp("d2-tied")
    shutil.copytree(tiny_checkpoints["qwen2"][1], root / "target")
    drafter = write_dflash2(root / "drafter", TargetConfig.from_json(root / "target"))
    opts = ExportOptions(
        out=root / "bundle",
        target=str(root / "target"),
        draft=str(drafter),
        max_context=MAX_CONTEXT,
        prefill_chunk=PREFILL_CHUNK,
        force=True,
        precision="int4",
    )
    return export_bundle(opts, progress=False)


def test_tied_low_bit_head_is_re_ranked_to_the_references_candidates(tied_int4):
    import onnx

    manifest = json.loads((tied_int4 / "manifest.json").read_text())
    # the fast head stays: int8 activations preselect, the table's own rows re-rank in fp32
    assert manifest["graphs"]["drafter"]["quantization"]["settings"]["accuracy_level"] == 4
    graph = onnx.load(str(tied_int4 / "drafter.onnx"), load_external_data=False).graph
    widths = [n for n in graph.node if n.op_type == "TopK"]
    assert len(widths) == 2 and any(n.op_type == "GatherElements" for n in graph.node)
    report = manifest["source"]["parity"]
    assert report["drafter.candidate_ids.agreement"] == 1.0
    # fp32 scores (level 4's own: 1.1e-3 here)
    assert report["drafter.lattice_scores.max_abs_diff"] < 1e-4 * max(
        1.0, report["drafter.lattice_scores.max_abs"]
    )
    from dflash_edge.runtime import Generator

    gen = Generator.load(tied_int4)
    for prompt in PROMPTS[:2]:  # lossless drafting
        want = gen.generate_ids(prompt, 30, draft="none", stop_token_ids=())
        got = gen.generate_ids(prompt, 30, draft="drafter", stop_token_ids=())
        assert got.token_ids == want.token_ids


class _Cfg:
    def __init__(self, tied: bool):
        self.tie_word_embeddings = tied


@pytest.mark.parametrize(
    "precision, table_bits, tied, level",
    [
        ("fp32", 8, True, 4),  # the tied head is re-ranked instead
        ("fp32", 8, False, 0),  # an untied low-bit head has no exact rows to re-rank on
        ("int4", 8, True, 0),  # the drafter's own low-bit layers
        ("fp32", 0, False, 4),  # nothing low-bit: the format as it was
    ],
)
def test_fp32_activations_only_where_candidates_need_them(precision, table_bits, tied, level):
    fmt = WeightFormat(precision, table_bits=table_bits)
    assert needs_fp32_activations(fmt, _Cfg(tied)) == (level == 0)
    assert weight_format(fmt, _Cfg(tied)).accuracy_level == level
    assert PRESELECT * 16 == 64  # Kc = 16: 64 rows preselected


def test_parity_names_the_row_whose_candidates_differ():
    want = np.sort(np.arange(21).reshape(1, 3, 7), -1)
    got = want.copy()
    got[0, 2, 6] = 99
    report = {}
    with pytest.raises(parity.ParityError, match=r"66\.7% of rows .* row 2 differs in tokens"):
        parity._check_candidates("drafter", got, want, parity.Tolerance(), report)
    assert report["drafter.candidate_ids.agreement"] == pytest.approx(2 / 3)
    fp16 = parity.tolerance_for("fp16", 4)
    parity._check_candidates("drafter", want, want, fp16, report)  # every row: passes
    assert fp16.candidates == 0.9 and parity.tolerance_for("int4", 4).candidates == 1.0
