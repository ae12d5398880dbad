"""The calculator widget (book/_static/calculator.js) in a real browser gives the package's numbers.

Debian's ``chromium`` is driven by Playwright pointed at the system browser (Playwright never
downloads one here). Without either, the tests are skipped and say why; ``.ci/run`` installs
``chromium`` when it runs as root, so CI runs them.
"""

from __future__ import annotations

import math
import re
import shutil
import sys
from pathlib import Path

import pytest
from trainfast.calculator import estimate_dict, export, setup_from_dict, write_script
from trainfast.distributed.step_time import TrainingSetup, estimate
from trainfast.transformer import PRESET_SHAPES

ROOT = Path(__file__).resolve().parents[1]
STATIC = ROOT / "book" / "_static"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (it is in requirements.txt)"
)
if CHROMIUM is None:
    pytest.skip(
        "no system chromium: install it with `apt-get install -y chromium` to run the widget "
        "in a browser",
        allow_module_level=True,
    )

# the scripts the book's pages load, in their order (the data first: the build writes it)
sys.path.insert(0, str(ROOT / "book" / "_ext"))
from build_support.page_assets import CALCULATOR_SCRIPTS  # noqa: E402

PAGE = (
    '<!doctype html><html><head><meta charset="utf-8">'
    '<link rel="stylesheet" href="calculator.css">'
    + "".join(f'<script src="{script}"></script>' for script in CALCULATOR_SCRIPTS)
    + '</head><body><div class="trainfast-calculator" data-preset="gpt2-small"></div>'
    "</body></html>"
)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory):
    site = tmp_path_factory.mktemp("widget")
    for name in (*CALCULATOR_SCRIPTS[1:], "calculator.css"):
        shutil.copy(STATIC / name, site / name)
    write_script(site / "calculator-data.js")
    (site / "index.html").write_text(PAGE)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        tab = browser.new_page()
        errors: list[str] = []
        tab.on("pageerror", lambda error: errors.append(str(error)))
        tab.on("requestfailed", lambda request: errors.append(f"failed: {request.url}"))
        tab.goto((site / "index.html").as_uri())  # from the file system: no server, no network
        tab.wait_for_selector('[data-out="time.step"]')
        assert not errors, errors
        yield tab
        browser.close()


def _setup(case: dict) -> TrainingSetup:
    return setup_from_dict(case["setup"])


def _flat(result: dict, prefix: str = "") -> dict[str, float | bool]:
    out: dict[str, float | bool] = {}
    for key, value in result.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def _mismatches(expected: dict, got: dict) -> list[str]:
    wrong = []
    for key, value in _flat(expected).items():
        other = _flat(got).get(key)
        if isinstance(value, bool) or not isinstance(other, (int, float)):
            same = other == value
        else:
            same = math.isclose(other, value, rel_tol=1e-12, abs_tol=1e-300)
        if not same:
            wrong.append(f"{key}: python {value!r}, browser {other!r}")
    return wrong


CASES = export()["cases"]


def test_the_widget_functions_match_python_on_the_grid(page):
    got = page.evaluate(
        "cases => cases.map("
        "c => trainfastCalculator.estimate(c.setup, window.TRAINFAST_CALCULATOR))",
        CASES,
    )
    for case, result in zip(CASES, got, strict=True):
        expected = estimate_dict(estimate(_setup(case)))  # recomputed here, not read back
        wrong = _mismatches(expected, result)
        assert not wrong, f"{case['setup']}: " + "; ".join(wrong)


SET_INPUTS = """x => {
  const form = document.querySelector('.trainfast-calculator form');
  const values = Object.assign({}, x.shape, x.assumptions, x);
  delete values.shape;
  delete values.assumptions;
  for (const [name, value] of Object.entries(values)) {
    const input = form.elements[name];
    if (input.type === 'checkbox') input.checked = value;
    else input.value = String(name === 'n_kv_heads' && value === null ? x.shape.n_heads : value);
  }
  form.elements.global_batch.dispatchEvent(new Event('input', {bubbles: true}));
  const out = {};
  for (const cell of document.querySelectorAll('.trainfast-calculator [data-out]')) {
    const raw = cell.dataset.value;
    out[cell.dataset.out] = raw === 'true' ? true : raw === 'false' ? false : Number(raw);
  }
  return out;
}"""


def test_the_widget_shows_python_numbers_for_inputs_typed_in(page):
    for case in CASES:
        shown = page.evaluate(SET_INPUTS, case["setup"])
        expected = estimate_dict(estimate(_setup(case)))
        wrong = _mismatches(expected, shown)
        assert not wrong, f"{case['setup']}: " + "; ".join(wrong)


def test_the_widget_names_a_bad_input_by_its_label_on_screen(page):
    setup = dict(CASES[0]["setup"], tensor=5)
    page.evaluate(SET_INPUTS, setup)
    message = page.text_content('[data-out="error"]')
    assert "“tensor parallel t” = 5" in message and "tensor" + "_" not in message
    assert page.get_attribute('input[name="tensor"]', "aria-invalid") == "true"
    with pytest.raises(ValueError, match="Invalid tensor: 5"):
        _setup({"setup": setup})


def test_the_widget_names_a_bad_assumption_by_its_label(page):
    setup = dict(CASES[0]["setup"])
    setup["assumptions"] = dict(setup["assumptions"], network_bytes_per_s=0)
    page.evaluate(SET_INPUTS, setup)
    assert "“network bytes/s per GPU” = 0" in page.text_content('[data-out="error"]')
    with pytest.raises(ValueError, match="Invalid network_bytes_per_s: 0"):
        _setup({"setup": setup})


#: Every message the widget can show names a field by a label that is on screen, never by an
#: identifier (``batch_size``), whichever field is wrong.
LABELS_ON_SCREEN = (
    """() => Array.from(document.querySelectorAll('.tfc-field > span'), s => s.textContent)"""
)


@pytest.mark.parametrize(
    "name",
    [
        "batch_size",
        "global_batch",
        "n_heads",
        "n_kv_heads",
        "tensor",
        "matmul_efficiency",
        "reserve",
        "gpus_per_node",
        "top_k",
    ],
)
def test_every_error_message_uses_a_label_on_screen(page, name):
    labels = page.evaluate(LABELS_ON_SCREEN)
    setup = dict(CASES[0]["setup"])
    if name in setup["shape"] or name == "batch_size":
        setup["shape"] = dict(setup["shape"], **{name: -3})
    elif name in setup["assumptions"]:
        setup["assumptions"] = dict(setup["assumptions"], **{name: -3})
    else:
        setup[name] = -3
    page.evaluate(SET_INPUTS, setup)
    message = page.text_content('[data-out="error"]')
    assert any(f"“{label}”" in message for label in labels), message
    assert not re.search(r"\b[a-z]+_[a-z_]+\b", message), f"an identifier in {message!r}"


def test_an_empty_field_is_reported_as_empty_and_the_results_stay_greyed(page):
    page.evaluate(SET_INPUTS, CASES[0]["setup"])
    box = page.locator(".tfc-output").bounding_box()
    page.fill('input[name="global_batch"]', "")
    message = page.text_content('[data-out="error"]')
    assert message == "“global batch (sequences)” is empty: type a number."
    results = page.locator(".tfc-results")
    assert results.is_visible() and "tfc-stale" in results.get_attribute("class")
    assert page.locator('[data-out="time.step"]').is_visible()
    assert float(results.evaluate("e => getComputedStyle(e).opacity")) < 1
    after = page.locator(".tfc-output").bounding_box()
    assert abs(after["x"] - box["x"]) < 1 and abs(after["width"] - box["width"]) < 1
    page.evaluate(SET_INPUTS, CASES[0]["setup"])  # typing a number back clears it
    assert not page.locator('[data-out="error"]').is_visible()
    assert "tfc-stale" not in results.get_attribute("class")


#: How much of each dropdown's chosen option is hidden: text width against the box, in px.
CUT_OPTIONS = """() => Array.from(document.querySelectorAll('.trainfast-calculator select'), s => {
  const probe = document.createElement('span');
  probe.style.font = getComputedStyle(s).font;
  probe.style.position = 'absolute';
  probe.style.whiteSpace = 'pre';
  probe.textContent = s.options[s.selectedIndex].text;
  document.body.appendChild(probe);
  const cut = probe.getBoundingClientRect().width + 24 - s.clientWidth;  // 24 px: the arrow
  probe.remove();
  return [s.name, probe.textContent, cut];
})"""


def _cut_options(page) -> list:
    return [row for row in page.evaluate(CUT_OPTIONS) if row[2] > 0]


def test_no_dropdown_cuts_the_name_it_shows(page):
    for index in range(page.locator('select[name="gpu"] option').count()):
        page.select_option('select[name="gpu"]', index=index)
        assert not _cut_options(page)
    page.add_style_tag(content=".tfc-field select { width: 6rem !important; }")  # planted defect
    try:
        assert _cut_options(page), "the check must see a cut name"
    finally:
        page.evaluate("() => document.head.lastElementChild.remove()")


def test_the_dashed_capacity_line_is_labelled(page):
    page.evaluate(SET_INPUTS, CASES[0]["setup"])
    label = page.locator('[data-out="capacity-label"]')
    assert label.is_visible() and "dashed line: usable memory" in label.text_content()
    bar = page.locator(".tfc-bar").bounding_box()
    box = label.bounding_box()
    assert bar["x"] - 1 <= box["x"] and box["x"] + box["width"] <= bar["x"] + bar["width"] + 1


def test_the_widget_offers_the_real_presets_and_every_modern_choice(page):
    offered = page.evaluate(
        "() => Array.from(document.querySelector('select[name=preset]').options, o => o.value)"
    )
    assert {"llama2-7b", "llama3-8b", "llama3-405b"} <= set(offered)
    assert not [name for name in offered if name.startswith("gpt-")]  # no GPT-2-style stand-ins
    page.select_option('select[name="preset"]', "llama3-405b")
    shape = PRESET_SHAPES["llama3-405b"]
    for name in ("norm", "positions", "mlp"):
        assert page.input_value(f'select[name="{name}"]') == getattr(shape, name)
    for name in ("qk_norm", "bias", "tied_head"):
        assert page.is_checked(f'input[name="{name}"]') == getattr(shape, name)
    assert page.input_value('input[name="n_kv_heads"]') == str(shape.n_kv_heads)


def test_the_widget_refuses_rope_with_an_odd_head_dimension(page):
    setup = dict(CASES[0]["setup"])  # GPT-2 small: 64-wide heads
    setup["shape"] = dict(setup["shape"], positions="rope", d_model=780)  # 12 heads of 65
    page.evaluate(SET_INPUTS, setup)
    message = page.text_content('[data-out="error"]')
    assert message.startswith("“positions” = rope: it rotates pairs") and "65" in message
    with pytest.raises(ValueError, match="Invalid head dimension for rotary positions: 65"):
        _setup({"setup": setup})
