"""What the CLI prints, and how: every message through ``say`` as plain text, never rich markup;
tables through ``table``/``table_row``; every --json through ``render_json``; a run's live phases
and progress (``RichReporter``) and its summary table (``_print_record``).

Text that is not ours (a job's log or summary.json, an instance's or AWS's words, a task file's
values) is printed inert (ec2gpu.inert: control characters shown as escapes). rich is imported
inside the functions that print (``LazyConsole``): `ec2gpu --help` prints no rich text and does
not import it (tests/unit/test_cli_text.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator, Mapping, Sequence

from ..inert import inert

if TYPE_CHECKING:  # rich is imported where it prints (the module docstring)
    from rich.console import Console
    from rich.progress import Progress, TaskID
    from rich.table import Table
    from rich.text import Text


class LazyConsole:
    """A rich Console made on first use, with ``options`` (``stderr=True``): importing rich costs
    `ec2gpu --help` about as much as the rest of its start-up, and --help prints no rich text.
    Every attribute is the Console's, and it is a context manager as the Console is; where rich
    itself is handed a console (a live progress display), ``get()`` gives the Console. A test may
    put a Console of its own in its place."""

    def __init__(self, **options: Any) -> None:  # rich Console's keyword arguments
        self._options: dict[str, Any] = options
        self._console: Console | None = None

    def get(self) -> Console:
        """The rich Console, made now if it was not yet."""
        if self._console is None:
            from rich.console import Console
            self._console = Console(**self._options)
        return self._console

    def __getattr__(self, name: str) -> Any:  # Any: whichever of the Console's attributes ``name`` is
        if name.startswith("__") or name in ("_options", "_console"):  # copy, pickle; before __init__
            raise AttributeError(name)
        return getattr(self.get(), name)

    def __enter__(self) -> Console:
        return self.get().__enter__()

    def __exit__(self, *exc_info: Any) -> None:  # (type, value, traceback) of an exception, or Nones
        return self.get().__exit__(*exc_info)


out = LazyConsole()
err = LazyConsole(stderr=True)


def plain(text: object, style: str = "") -> Text:
    """Text that is not ours (a job's log or summary.json, an instance's or AWS's words, a task
    file's values, an error message quoting them) ready to print or to put in a table cell: a rich
    Text, its control characters shown as escapes (ec2gpu.inert), never read as rich markup."""
    from rich.text import Text
    return Text(inert(str(text)), style=style)


def labelled(label: str, style: str, text: object, text_style: str = "") -> Text:
    """'LABEL TEXT' with LABEL in ``style`` (error:, hint:, warning:), TEXT as ``plain`` (in
    ``text_style``): a rich Text."""
    from rich.text import Text
    return Text.assemble((label, style), " ", (inert(str(text)), text_style))


def say(console: Console | LazyConsole, text: object, style: str = "", *, label: str = "", label_style: str = "",
        **options: Any) -> None:
    """The one way a message reaches the user: ``text`` printed on ``console`` (``out``, ``err``, a
    reporter's) as plain text, never rich markup (``[/]`` or ``[bold]`` in it stay those
    characters), with its control characters made visible (``plain``), in ``style``; after a
    ``label`` in ``label_style`` ('error:' in red). A rich renderable (a Table whose cells are
    ``plain``, a Text made by ``plain`` or ``labelled``) is printed as it is. ``options`` go to
    Console.print (``soft_wrap=True``: one line, however wide)."""
    from rich.console import ConsoleRenderable  # a runtime-checkable Protocol: has __rich_console__
    from rich.table import Table
    if not isinstance(text, ConsoleRenderable):
        text = labelled(label, label_style, text, style) if label else plain(text, style)
    elif isinstance(text, Table):  # no line of a table ends in the spaces that pad it to its width
        text = unpadded(console, text)
    console.print(text, highlight=False, **options)


def unpadded(console: Console | LazyConsole, renderable: Any) -> Any:
    """``renderable`` (a rich renderable) as ``console`` renders it, each line without the blank
    cells at its end (a table pads every line to its width, a copied line ends in spaces): rich
    Segments, printed as they are."""
    from rich.segment import Segment, Segments
    out: list[Segment] = []
    for line in console.render_lines(renderable, console.options, pad=False, new_lines=False):
        while line and not line[-1].text.strip() and not line[-1].control:
            line = line[:-1]
        if line:
            last = line[-1]
            line = [*line[:-1], Segment(last.text.rstrip(" "), last.style, last.control)]
        out += [*line, Segment.line()]
    return Segments(out)


def note(text: str, style: str = "dim") -> None:
    """Say on stderr a note that a lower layer relays (its ``log=``/``note=`` callbacks: it may quote
    an instance or a task file): in ``style``, inert, never markup."""
    say(err, text, style)


def warn(text: str) -> None:
    """'warning: TEXT' on stderr, TEXT inert and never markup (a task file's warnings quote it)."""
    say(err, text, label="warning:", label_style="yellow")


def error(message: str, hint: str | None = None, tail: str = "") -> None:
    """'error: MESSAGE', the TAIL below it (an instance's last lines) and 'hint: HINT' on stderr,
    each inert and never markup: what ``main()`` says of a failed command. The message and the hint
    are one line each, however long (the terminal folds them, rich does not): a path or a command in
    them stays whole where stderr goes to a file or a pipe (rich's width is 80 there)."""
    say(err, message, label="error:", label_style="red", soft_wrap=True)
    if tail:
        say(err, tail)
    if hint:
        say(err, hint, label="hint:", label_style="yellow", soft_wrap=True)


def table(*columns: str, title: str | None = None, **options: Any) -> Table:
    """A rich Table with ``columns`` (header words of ours) and ``options``, its ``title`` as
    ``plain`` text in rich's title style (it may name a region or a task): filled with
    ``table_row``, printed with ``say``."""
    from rich.table import Table
    return Table(*columns, title=None if title is None else plain(title, "table.title"), **options)


def table_row(t: Table, *cells: object) -> None:
    """Add a row to the rich table ``t`` with each cell as ``plain`` (a Text made by ``plain`` stays as
    it is): a table's cells quote tags, task files and jobs, never read as markup."""
    from rich.console import ConsoleRenderable  # a runtime-checkable Protocol: has __rich_console__
    t.add_row(*(c if isinstance(c, ConsoleRenderable) else plain("" if c is None else c) for c in cells))


def render_json(obj: object) -> None:
    """The one way every command's ``--json`` is printed: ``obj`` (dicts, lists, numbers, strings;
    an api record, at any depth, as its ``to_json()``; anything else, e.g. a datetime or a Path, as
    its ``str()``) as JSON indented 2, on stdout, so that ``ec2gpu ... --json | jq`` always gets the
    same shape of document."""
    import json
    print(json.dumps(obj, indent=2, default=_jsonable))


def _jsonable(obj: object) -> object:
    """json.dumps' ``default``: an api record's ``to_json()`` document, else ``str(obj)``."""
    to_json = getattr(obj, "to_json", None)
    return to_json() if callable(to_json) else str(obj)


#: without a terminal (CI, a pipe, a log file) no bar can redraw, and rich's Progress prints nothing
#: there: a phase says where it is in a line of its own whenever nothing was printed for this long
#: (seconds), as tqdm prints a line per update where it cannot redraw
PROGRESS_EVERY_S = 30.0


def progress_words(p: Mapping[str, Any]) -> str:
    """The job's progress (runs/execute/nodes.ProgressReader's record) as the bar's detail shows
    it (pure; the job's words made inert): 'epoch 2  2,000 samples/s  ETA 1:05'."""
    rate = f"{p['rate']:,.0f} {p.get('rate_unit', '/s')}" if isinstance(p.get("rate"), (int, float)) else ""
    eta = p.get("eta_s")
    eta = f"ETA {int(eta) // 60}:{int(eta) % 60:02d}" if isinstance(eta, (int, float)) else ""
    return inert("  ".join(x for x in (str(p.get("label") or ""), rate, eta) if x))


class RichReporter:
    """Pipeline reporter: per phase a spinner with its live elapsed seconds and, once the job
    writes progress (its $EC2GPU_PROGRESS_FILE), a bar with its label, rate and ETA; log lines
    above them; a "done"/"stopped" line with the seconds when the phase ends. Without a terminal,
    a line saying the phase, its seconds and the job's progress every ``every_s`` seconds of
    silence instead (``tick``; ``clock``: time.monotonic, a test's own)."""

    def __init__(self, console: Console | LazyConsole, quiet: bool = False, clock: Callable[[], float] | None = None,
                 every_s: float = PROGRESS_EVERY_S) -> None:
        import time

        from ..runs.execute.reporter import Reporter
        console = console.get() if isinstance(console, LazyConsole) else console  # rich's Live needs a Console
        self.inner, self.console, self.quiet = Reporter(), console, quiet
        self.phases = self.inner.phases
        self.notes = self.inner.notes
        self._live: tuple[Progress, TaskID] | None = None  # (rich Progress, task id) of the phase under way
        self.clock, self.every_s = clock or time.monotonic, every_s
        self._said_at = self.clock()  # when a line was last printed
        self._under_way: tuple[str, float] | None = None  # (phase, its start by ``clock``) without a terminal
        self._progress: Mapping[str, Any] | None = None  # the job's last progress in that phase

    def tick(self) -> None:
        """Without a terminal: say the phase under way, its seconds and the job's last progress when
        nothing was printed for ``every_s`` seconds (a phase's ticker calls this; a test may)."""
        if self._under_way is None or self.clock() - self._said_at < self.every_s:
            return
        name, t0 = self._under_way
        p = self._progress
        done = f", {p['done']:,}/{p['total']:,}" if p and isinstance(p.get("done"), int) and \
            isinstance(p.get("total"), int) else ""
        detail = progress_words(p) if p else ""
        self._print(plain(f"{name}: {self.clock() - t0:.0f} s{done}" + (f"  {detail}" if detail else ""), "dim"))

    def _ticking(self, name: str) -> Callable[[], None]:
        """Start the ticker of phase ``name`` (no terminal: a daemon thread that calls ``tick``);
        return what stops it."""
        import threading
        outer = self._under_way  # a phase within a phase: the outer one is said again once this one ends
        self._under_way, self._progress, self._said_at = (name, self.clock()), None, self.clock()
        stop = threading.Event()

        def ticker() -> None:
            while not stop.wait(min(self.every_s, 5.0)):
                self.tick()
        threading.Thread(target=ticker, name=f"ec2gpu-{name}-ticker", daemon=True).start()

        def stopped() -> None:
            stop.set()
            self._under_way = outer
        return stopped

    def phase(self, name: str) -> ContextManager[None]:
        import contextlib
        import time

        @contextlib.contextmanager
        def cm() -> Iterator[None]:
            from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
            t0 = time.monotonic()
            # live only on a terminal: elsewhere (a pipe, CI, a log file) it could not redraw
            live = None if self.quiet or not self.console.is_terminal else Progress(
                SpinnerColumn(), TextColumn("{task.description}", style="bold", markup=False), TimeElapsedColumn(),
                BarColumn(bar_width=24), TextColumn("{task.fields[detail]}", markup=False), console=self.console,
                transient=True)
            if live:
                self._live = (live, live.add_task(name, total=None, detail="", start=True))
                live.start()
            stop_ticker = self._ticking(name) if live is None and not self.quiet else None
            ok = False
            try:
                with self.inner.phase(name):
                    yield
                ok = True
            finally:
                if live:
                    live.stop()
                    self._live = None
                if stop_ticker:
                    stop_ticker()
                from rich.text import Text
                self._print(Text.assemble(("done", "green") if ok else ("stopped", "red"), " ", inert(name), " ",
                                          (f"{time.monotonic() - t0:.1f} s", "dim")))
        return cm()

    def progress(self, p: dict[str, Any]) -> None:
        """Show the job's progress (runs/execute/nodes.ProgressReader) as the phase's bar."""
        self.inner.progress(p)
        if self._live is None:  # no terminal: the ticker says it (tick)
            self._progress = p
            self.tick()
            return
        live, task = self._live
        live.update(task, total=p["total"], completed=p["done"],  # the job's words: inert, not markup
                    detail=progress_words(p))

    def log(self, line: str) -> None:
        from rich.text import Text
        self._print(Text.assemble(("| ", "cyan"), inert(line)))

    def note(self, text: str) -> None:
        self.inner.note(text)
        self._print(plain(text, "dim"))

    def _print(self, text: object) -> None:
        if not self.quiet:
            say(self.console, text)
            self._said_at = self.clock()


def cost_rows(record: Mapping[str, Any]) -> list[tuple[str, str]]:
    """'estimate' and 'actual' lines of a run record, side by side in the summary."""
    rows: list[tuple[str, str]] = []
    est = record.get("estimate") or {}
    if record.get("estimated_cost_usd") is not None:
        rows.append(("estimate", f"${record['estimated_cost_usd']:.4f} for {est.get('billed_seconds', 0):.0f} s "
                     f"(times: {est.get('time_source', '')})"))
    if record.get("billed_seconds") is not None and record.get("market") != "local":
        usd = record.get("cost_usd")
        parts = [a for a in record.get("attempts") or [] if "compute_usd" in a]  # runs/plan/costs.actual_cost's
        compute = None if not parts or any(a["compute_usd"] is None for a in parts) else \
            sum(a["compute_usd"] for a in parts)
        rate = (compute or 0) * 3600 / record["billed_seconds"] if parts and record["billed_seconds"] else \
            record.get("usd_per_hour") or 0
        rows.append(("actual", ("unknown" if usd is None else f"${usd:.4f}") +
                     (f": compute {'?' if compute is None else f'${compute:.4f}'} =" if parts else " =") +
                     f" {record['billed_seconds']:.0f} s billed (running from "
                     f"{str(record.get('billing_started_at') or record.get('launched_at', ''))[11:19]}"
                     f" to termination {str(record.get('terminated_at', ''))[11:19]} UTC) x "
                     f"{rate:.4f} USD/h ({record.get('price_source')})" +
                     (f"; public IPv4 ${sum(a.get('public_ipv4_usd') or 0 for a in parts):.4f}; EBS "
                      f"${sum(a.get('ebs_usd') or 0 for a in parts):.4f} "
                      f"({sum(a.get('volume_gib') or 0 for a in parts):g} GiB gp3)" if parts else "")))
    return rows


def attempt_rows(attempts: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """One line per instance of a managed run: where it ran, its bill, why it ended."""
    rows: list[tuple[str, str]] = []
    for a in attempts:
        usd = a.get("cost_usd")
        node = "" if a.get("node") is None else f" node {a['node']}"
        rows.append((f"attempt {a['attempt']}{node}",
                     f"{a['instance_id']} {a['instance_type']} {a['market']} {a.get('zone') or ''}: "
                     f"{a.get('billed_seconds', 0):.0f} s, {'?' if usd is None else f'${usd:.4f}'}; {a['ended']}"))
    return rows


def _training_row(s: Mapping[str, Any]) -> str:
    """'1 epoch of cnn on cpu: 12.00 s training, 15.8 s wall' from the trainer's summary.json (pure).
    After a resume the training seconds add up every attempt's; the wall time is the last attempt's."""
    if not s:
        return "- (no summary.json)"
    if set(s) == {"invalid", "raw"}:  # runs/job_summary.py's marker: what the job wrote failed its schema
        return f"- (summary.json not accepted: {s['invalid']})"
    epochs = s.get("epochs")
    gpu = f" ({s['gpu_name']})" if s.get("gpu_name") else ""
    resumed = " (last attempt)" if s.get("resumed_from") else ""
    return (f"{epochs} epoch{'' if epochs == 1 else 's'} of {s.get('model')} on {s.get('device')}{gpu}: "
            f"{s.get('train_seconds') or 0:.2f} s training, {s.get('wall_seconds') or 0:.1f} s wall{resumed}")


def _pool_rows(pool: Mapping[str, Any]) -> list[tuple[str, str]]:
    """An array's or a sweep's lines in its run's table (pure): its elements by how they ended and,
    where they report one, the best test accuracy and its element (runs/element_table.best_accuracy)."""
    from ..runs import element_table
    from ..words import count
    elements = pool.get("elements") or []
    ended: dict[str, int] = {}
    for e in elements:
        ended[str(e.get("status"))] = ended.get(str(e.get("status")), 0) + 1
    rows = [("elements", count(len(elements), "element") + (": " if ended else "")
             + ", ".join(f"{n} {status}" for status, n in sorted(ended.items())))]
    best = element_table.best_accuracy(elements)
    if best is not None:
        rows.append(("best test accuracy", f"{100 * best[0]:.2f}% (element {best[1]})"))
    return rows


def _print_record(record: Mapping[str, Any], as_json: bool) -> None:
    if as_json:
        render_json(record)
        return
    import json

    s = record.get("summary") or {}
    t = table(title=f"run {record['run_id']}", show_header=False, box=None)
    where = "this machine" if record.get("market") == "local" else \
        f"{record.get('instance_id')} {record['instance_type']} {record['market']} {record.get('zone') or ''}"
    rows = [("instance", where)]
    if record.get("task") == "bake":  # an image bake: the image it made
        rows.append(("image", f"{s.get('image_id', '-')} {s.get('name', '')} (task {s.get('task')}, from {s.get('base')}; "
                              f"torch {s.get('torch_version')})" if s else "- (none made)"))
    elif record.get("pool"):  # an array or a sweep: its elements (the table above), its best accuracy
        rows += _pool_rows(record["pool"])
    elif record.get("task") not in (None, "mnist"):  # a user's task: its exit and its own summary.json
        code = record.get("exit_status")
        rows += [("task", f"{record['task']}: " + (f"exit {code}" if code is not None else record.get("status", "?"))),
                 ("summary", json.dumps(s, default=str)[:200] if s else "- (the job wrote no summary.json)")]
    else:
        rows += [("test accuracy", f"{100 * record['test_acc']:.2f}%" if record.get("test_acc") is not None else "-"),
                 ("training", _training_row(s))]
    rows += [(f"  {k}", f"{v:.1f} s") for k, v in record.get("phases", {}).items()]
    rows += cost_rows(record)
    if len(record.get("attempts") or []) > 1:  # several attempts, or a cluster's nodes
        rows += attempt_rows(record["attempts"])
    rows.append(("artifacts", record["artifacts"]))
    for k, v in rows:  # values quote the job's summary.json, the task file, the instance: never markup
        table_row(t, plain(k, "bold"), v)
    say(out, t)
