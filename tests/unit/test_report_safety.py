"""Reports leak nothing and run nothing: secrets scrubbed and user strings escaped in .ipynb and .html.

Every test writes a real SQLite store, exports it with the real exporter and renders the HTML with
the real nbconvert; the HTML is parsed to look for live elements, never matched as text only.
"""

from __future__ import annotations

import json
import re
import threading
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import nbformat
import pytest

from dtwork.report import export
from dtwork.store.runs import RunStore

# -- parsing the exported HTML ----------------------------------------------------------------


class Page(HTMLParser):
    """Every element with its attributes, the text of each script, and the visible text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.scripts: list[str] = []
        self._text: list[str] = []
        self._in: str | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))
        if tag in ("script", "style"):
            self._in = tag
            if tag == "script":
                self.scripts.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == self._in:
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "script":
            self.scripts[-1] += data
        elif self._in is None:
            self._text.append(data)

    @property
    def text(self) -> str:
        return "".join(self._text)


def _live(page: Page) -> list[str]:
    """Injected markup that a browser would run: event handlers, javascript: URLs, bare scripts."""
    found = [
        f"<{tag} {name}={value!r}>"
        for tag, attrs in page.elements
        for name, value in attrs.items()
        if (name.startswith("on") and "alert(" in value) or "javascript:" in value.lower()
    ]
    found += [f"<{tag} src=x>" for tag, attrs in page.elements if attrs.get("src") == "x"]
    found += [f"<script>{s}" for s in page.scripts if re.match(r"\s*alert\(", s)]
    return found


def _sources(nb: Any, kind: str) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == kind]


# -- user strings that are markup -------------------------------------------------------------

IMG = "<img src=x onerror=alert(1)>"
SCRIPT = "<script>alert(2)</script>"
LINK = "[click](javascript:alert(3))"
SVG = "<svg onload=alert(4)>"
CODE_BREAK = "`</code><img src=x onerror=alert(5)>`"
ANCHOR = '<a href="javascript:alert(6)">x</a>'
TITLE = "</title><img src=x onerror=alert(7)>"


@pytest.fixture
def hostile_store(tmp_path: Path) -> tuple[Path, int]:
    """A run whose metric names, run name, events, cell error, config and hosts are all markup."""
    path = tmp_path / "store" / "runs.sqlite"
    config = f"seed: 1\nhyperparameters:\n  note: '{ANCHOR}'\n"
    with RunStore(path) as s:
        rid = s.create_run(name=SCRIPT + TITLE, world_size=2, backend="gloo", config_yaml=config)
        seq = s.add_cell(rid, f"ctx.log(**{{{IMG!r}: 1.0}})")
        s.finish_cell(rid, seq, "error", f"ValueError: {CODE_BREAK}")
        rows = [{"step": i, "name": n, "value": 1.0 / (i + 1)} for i in range(5) for n in (IMG, LINK, "loss")]
        s.add_metrics(rid, rows)
        s.add_event(rid, SVG, f"a warning: {LINK} {SVG}")
        s.set_environment(rid, {"hosts": [ANCHOR], "ranks": [{"rank": 0, "hostname": IMG, "device": SVG}]})
    return path, rid


def test_user_strings_are_escaped_in_markdown_and_html(
    hostile_store: tuple[Path, int], tmp_path: Path
) -> None:
    store, rid = hostile_store
    rep = export(rid, tmp_path / "x.ipynb", store=store, html=True, environ={})
    assert rep.html_path is not None
    page = Page(rep.html_path.read_text())
    assert not _live(page), _live(page)
    # The strings are shown as text, not dropped.
    for shown in (IMG, SCRIPT, SVG, ANCHOR, "</code><img src=x onerror=alert(5)>", "click"):
        assert shown in page.text, shown
    nb = nbformat.read(rep.path, as_version=4)
    for source in _sources(nb, "markdown"):
        assert not re.search(r"<(?:img|script|svg|a)\b", source.replace(CODE_BREAK.strip("`"), "")), source
        assert not re.search(r"(?<!\\)\]\(javascript:", source), source
    assert page.text.count(IMG) >= 2  # the summary's final value and the environment's host


def test_the_html_of_a_clean_store_has_no_live_markup_either(tmp_path: Path) -> None:
    """The check above would pass on an empty page: here it runs on a page with figures."""
    store = tmp_path / "runs.sqlite"
    with RunStore(store) as s:
        rid = s.create_run(world_size=1, backend="gloo")
        s.add_cell(rid, "x = 1")
        s.add_metrics(rid, [{"step": i, "name": "loss", "value": 1.0} for i in range(3)])
    rep = export(rid, tmp_path / "c.ipynb", store=store, html=True, environ={})
    page = Page(rep.html_path.read_text())  # type: ignore[union-attr]
    assert not _live(page) and any("Plotly.newPlot" in s for s in page.scripts)


# -- secrets and near-misses ------------------------------------------------------------------

WANDB = "7c3f9a2b8d1e4f6a0b5c9d2e8f1a3b4c6d7e9f01"
WANDB_LOGIN = "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567"
KERNEL_WANDB = "e4d909c290d0fb1ca068ffaddf22cbd0aa11bb22"  # only in the kernel's environment
AWS_ID = "AKIA" + "IOSFODNN7QWERTYZ"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzq9Xr2Lk8M"
AWS_SESSION = "FwoGZXIvYXdzEJr//////////wEaDOzW5L2Yx8mP3xZ1pSKCAT3nQ8+vLxk2TqRrbWm7YcNpJh0sFg=="
GOOGLE = "AIza" + "SyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW"
STRIPE_LIVE = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
STRIPE_RESTRICTED = "rk_live_" + "9hT27QpLmNb4XcVz8KsJ1wYe"
STRIPE_TEST = "sk_test_" + "51HxYzQ2eZvKYlo2C0aBcDeF"
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkFkYSJ9"
    ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
GITHUB = "ghp_" + "Xy7Qw2Er9Ty4Ui8Op3As6Df1Gh5Jk0LzMnBvCx"
SLACK = "xoxb-" + "2048-1024-Zq8Wm3Xn7Lp2Rt6Yv1Bs"
PEM_BODY = "MIIEowIBAAKCAQEA7yF0sQ9XhJ2kLw3Zp8VnT4RbYc6MdE1fUaG5iHjK0lNoPqRsTuVwXyZ"
PEM = f"-----BEGIN RSA {'PRIVATE'} KEY-----\n{PEM_BODY}\nq8Wm2Ln4Ko6Jp0Ih\n-----END RSA {'PRIVATE'} KEY-----"
CLI_PASSWORD = "Tr0ub4dor-and-3"
URL_PASSWORD = "Sup3rS3cretPw"

SECRET_LINES = [
    f'os.environ["WANDB_API_KEY"] = "{WANDB}"',
    f'wandb.login(key="{WANDB_LOGIN}")',
    f's3 = boto3.client("s3", aws_access_key_id="{AWS_ID}", aws_secret_access_key="{AWS_SECRET}")',
    f"!AWS_SESSION_TOKEN={AWS_SESSION} aws s3 ls",
    f'maps = f"https://maps.googleapis.com/maps/api/geocode/json?address=x&key={GOOGLE}"',
    f'stripe.api_key = "{STRIPE_LIVE}"',
    f"restricted, test = {STRIPE_RESTRICTED!r}, {STRIPE_TEST!r}",
    f'headers = {{"Authorization": "Bearer {JWT}"}}',
    f'PRIVATE = """{PEM}"""',
    f"!python fetch.py --user ada --password {CLI_PASSWORD} --out data/",
    f'engine = create_engine("postgresql://trainer:{URL_PASSWORD}@db.example.com:5432/runs")',
    'short = "postgresql://u:pw@h/db"',
    f"gh, slack = {GITHUB!r}, {SLACK!r}",
]
SECRETS = [WANDB, WANDB_LOGIN, KERNEL_WANDB, AWS_ID, AWS_SECRET, AWS_SESSION, GOOGLE, STRIPE_LIVE]
SECRETS += [STRIPE_RESTRICTED, STRIPE_TEST, JWT, PEM_BODY, "q8Wm2Ln4Ko6Jp0Ih", CLI_PASSWORD, URL_PASSWORD]
SECRETS += [GITHUB, SLACK, GITHUB[4:20], SLACK[5:20]]

NEAR_MISSES = [  # code and data that look a little like secrets and must stay exactly as written
    "db = connect(user, passwd=my_var)",
    "password = getpass()",
    'tokenizer = AutoTokenizer.from_pretrained("bert-base-uncased")',
    'api_key = os.environ["WANDB_API_KEY"]',
    'sha = "3f786850e387550fdab836ed7e6dc881de23001b"',
    'expected_md5 = "d41d8cd98f00b204e9800998ecf8427e"',
    'ckpt = "/data/runs/123e4567-e89b-12d3-a456-426614174000/step-10.pt"',
    'run_uuid = "123e4567-e89b-12d3-a456-426614174000"',
    'commit = "9fceb02d0ae598e95dc970b74767f19372d61af8"',
    "key_dim, num_keys = 64, 8",
    'sort_key = "loss"',
    'token_ids = batch["input_ids"]',
    'password_field = "password"',
    'auth_url = "https://example.com/login"',
    'token_file = "/home/ada/.cache/hf/token"',
    "secret_sauce = compute(x)",
    "!python train.py --tokenizer bert --lr 0.1",
]


@pytest.fixture
def secret_store(tmp_path: Path) -> tuple[Path, int]:
    """Secrets in cells, the run name, an event, a cell error and the config; near-misses in a cell."""
    path = tmp_path / "store" / "runs.sqlite"
    config = (
        "seed: 3\nhyperparameters:\n"
        f"  database: postgresql://u:pw@h/db\n  note: 'Bearer {JWT}'\n  db_url: 'mysql://ml:{URL_PASSWORD}@x/y'\n"
    )
    with RunStore(path) as s:
        rid = s.create_run(name=f"sweep {STRIPE_TEST}", world_size=2, backend="gloo", config_yaml=config)
        s.add_cell(rid, "\n".join(SECRET_LINES))
        s.add_cell(rid, "\n".join(NEAR_MISSES))
        seq = s.add_cell(rid, "fetch()")
        s.finish_cell(rid, seq, "error", f"HTTPError: 403 for https://maps.googleapis.com/x?key={GOOGLE}")
        s.add_event(rid, "warning", f"wandb: logged in with {KERNEL_WANDB} (from the kernel)")
        s.add_metrics(rid, [{"step": i, "name": "loss", "value": 1.0} for i in range(3)])
    return path, rid


def test_secret_corpus_is_scrubbed_and_near_misses_kept(
    secret_store: tuple[Path, int], tmp_path: Path
) -> None:
    store, rid = secret_store
    kernel = {"WANDB_API_KEY": KERNEL_WANDB, "HOME": "/home/ada"}  # what the kernel sends
    rep = export(rid, tmp_path / "s.ipynb", store=store, html=True, environ=kernel)
    assert rep.html_path is not None
    nb_text, html_text = rep.path.read_text(), rep.html_path.read_text()
    page = Page(html_text)
    nb = nbformat.read(rep.path, as_version=4)
    sources = "\n".join(c.source for c in nb.cells)
    for secret in SECRETS:
        for where, text in (("ipynb", nb_text), ("cells", sources), ("html", html_text), ("page", page.text)):
            assert secret not in text, f"{secret[:12]}... left in the {where}"
    for where, text in (("cells", sources), ("page", page.text)):
        assert ":pw@" not in text, f"the URL password left in the {where}"
        assert "postgresql://u:" in text and "--password <scrubbed>" in text  # only the secret part goes
    near = next(c.source for c in nb.cells if c.source.startswith("%%dtrain") and "passwd" in c.source)
    assert near.split("\n")[1:] == NEAR_MISSES
    for line in NEAR_MISSES:
        assert line in page.text, line
    found = "\n".join(rep.scrubbed)
    assert "$WANDB_API_KEY" in found and "run name" in found and "error" in found and "config." in found
    assert KERNEL_WANDB not in found and "/home/ada" in page.text  # HOME is not a secret's name


def test_route_scrubs_with_the_kernel_environment_sent_in_the_body(tmp_path: Path) -> None:
    """The server exports with the environ the request carries (tested through HTTP in test_server)."""
    from dtwork.server import queries

    assert queries.report_environ(b"") == {}
    assert queries.report_environ(b'{"environ": {"A_TOKEN": "v"}}') == {"A_TOKEN": "v"}
    for bad in (b"[1]", b"{", b'{"environ": {"A": 1}}', b'{"environ": ["A"]}', b"\xff"):
        with pytest.raises(ValueError, match="environ|JSON"):
            queries.report_environ(bad)


# -- size ---------------------------------------------------------------------------------------


def test_report_notebook_is_small_and_html_inlines_plotly_once(tmp_path: Path) -> None:
    """Figures are plotly JSON in the .ipynb (JupyterLab renders them); the HTML carries plotly.js once."""
    from plotly.offline import get_plotlyjs_version

    store = tmp_path / "runs.sqlite"
    steps = 300
    with RunStore(store) as s:
        rid = s.create_run(world_size=2, backend="gloo", global_batch_size=64, per_slot_batch_size=32)
        s.add_cell(rid, "train()")
        rows: list[dict[str, Any]] = []
        for i in range(steps):
            rows += [{"step": i, "name": n, "value": 1.0 / (i + 1)} for n in ("loss", "lr", "grad_norm")]
            rows += [{"kind": "gns", "step": i, "name": n, "value": 50.0 + i} for n in ("b_simple", "g2")]
            rows += [
                {"kind": "perf", "step": i, "rank": r, "name": n, "value": 0.01 * (r + 1)}
                for r in (0, 1)
                for n in ("samples_per_s", "step_time", "compute_time", "comm_time", "data_time")
            ]
        s.add_metrics(rid, rows)
    rep = export(rid, tmp_path / "big.ipynb", store=store, html=True, environ={})
    size = rep.path.stat().st_size
    assert size < 1_000_000, f"{size} bytes"
    nb = nbformat.read(rep.path, as_version=4)
    figures = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "display_data"]
    assert len(figures) >= 5
    for output in figures:
        assert set(output.data) == {"application/vnd.plotly.v1+json", "text/plain"}
        assert json.dumps(output.data["application/vnd.plotly.v1+json"])[:1] == "{"
    html = rep.html_path.read_text()  # type: ignore[union-attr]
    banner = f"plotly.js v{get_plotlyjs_version()}"
    assert html.count(banner) == 1, html.count(banner)
    assert html.count("Plotly.newPlot") == len(figures)


# -- concurrency ----------------------------------------------------------------------------------


def test_two_exports_at_once_in_one_process_give_two_correct_reports(
    secret_store: tuple[Path, int], hostile_store: tuple[Path, int], tmp_path: Path
) -> None:
    results: dict[str, Any] = {}

    def run(key: str, store: Path, rid: int) -> None:
        try:
            results[key] = export(rid, tmp_path / f"{key}.ipynb", store=store, html=True, environ={})
        except BaseException as exc:  # pragma: no cover - reported below
            results[key] = exc

    threads = [
        threading.Thread(target=run, args=("a", *secret_store)),
        threading.Thread(target=run, args=("b", *hostile_store)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    a, b = results["a"], results["b"]
    assert not isinstance(a, BaseException) and not isinstance(b, BaseException), results
    nb_a, nb_b = (nbformat.read(r.path, as_version=4) for r in (a, b))
    assert "sweep" in nb_a.cells[0].source and "alert(2)" in nb_b.cells[0].source
    for nb in (nb_a, nb_b):
        streams = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "stream"]
        assert len(streams) == 1 and "scaling sweep" in streams[0].text  # each its own outputs, once
