"""The HTML report's inline style sheet and script (reports.html_report writes them into
the page: no external file, font or request).

The script reads the page's rows (`tr.row`, id `rI` for the I-th result, which indexes the
JSON block `#rows-data` holding the columns not shown in the row) and gives:
- the filter box (`#filter`): every word typed must occur in a row's text (case, status,
  message and its other columns); with the status selector (`#status`), rows, failure rows,
  grid rows and whole sections that do not match hide; `#shown` counts what is left, and
  when few rows are left their sections open;
- a click on a row toggles a detail row with every other column;
- a click on a column header sorts that table (numbers by value, statuses worst first);
- a link to a row or section (`#r12`, `#g3`: the failures, the grid, the plots' points)
  opens the sections around it, clears a filter that hides it, and scrolls it into view;
  a click on a plot where no point is linked goes to the row under that x coordinate.
"""

from __future__ import annotations

from reports.html_plots import STATUS_COLOURS

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #212121; }
h1 { font-size: 1.4em; margin: 0 0 .5em; } h2 { font-size: 1.15em; margin: 1.2em 0 .4em; }
.summary span, .badge { display: inline-block; padding: .1em .55em; margin-right: .3em;
  border-radius: .8em; color: #fff; font-weight: 600; font-size: .9em; }
dl.meta { display: grid; grid-template-columns: max-content auto; gap: .1em 1em;
  color: #555; font-size: .9em; }
dl.meta dt { font-weight: 600; } dl.meta dd { margin: 0; font-family: monospace; }
.controls { position: sticky; top: 0; background: #fff; padding: .5em 0; z-index: 2;
  border-bottom: 1px solid #eee; }
.controls input { font: inherit; width: 28em; max-width: 60vw; padding: .2em .4em; }
.controls select, .controls button { font: inherit; }
#shown { color: #555; margin-left: .6em; }
figure { display: inline-block; margin: .5em 1em .5em 0; }
figcaption { font-size: .9em; color: #555; }
table { border-collapse: collapse; font-size: .9em; }
th, td { border: 1px solid #ddd; padding: .2em .5em; text-align: left; vertical-align: top; }
thead th { background: #f5f5f5; cursor: pointer; user-select: none; white-space: nowrap; }
thead th::after { content: " \\2195"; color: #aaa; }
thead th.asc::after { content: " \\2191"; color: #333; }
thead th.desc::after { content: " \\2193"; color: #333; }
.grids { display: flex; flex-wrap: wrap; gap: 1em; align-items: flex-start;
  overflow-x: auto; }
.legend { color: #555; font-size: .9em; margin: 0 0 .5em; }
table.grid td { text-align: center; min-width: 3.5em; }
table.grid td a, table.grid th a { color: inherit; text-decoration: none; display: block; }
table.grid td.w-none { background: #fff; color: #bbb; }
table.grid small { display: block; font-size: .8em; }
table.rows td:first-child, table.fails td:first-child { font-family: monospace; }
table.rows td:last-child, table.fails td.msg { white-space: pre-wrap; max-width: 60em; }
table.fails code { white-space: pre-wrap; word-break: break-all; }
tr.row, svg.plot { cursor: pointer; } tr.row:hover { background: #f5f9ff; }
tr.detail td { background: #fafafa; }
tr.detail dl { display: grid; grid-template-columns: max-content auto; gap: 0 1em; margin: 0; }
tr.detail dt { font-weight: 600; } tr.detail dd { margin: 0; font-family: monospace;
  white-space: pre-wrap; }
details.sect { margin: .3em 0; border: 1px solid #e0e0e0; border-radius: 4px;
  padding: .2em .6em; }
details.sect > summary { cursor: pointer; font-weight: 600; }
details.sect > summary .badge { font-weight: 600; }
details.sect > table { margin: .4em 0; }
.hid { display: none !important; }
:target, .flash { outline: 3px solid #1565c0; }
"""
for _s, _c in STATUS_COLOURS.items():
    CSS += (f"td.status-{_s} {{ background: {_c}; }}\n.summary .{_s}, .badge.{_s} "
            f"{{ background: {_c}; }}\ntr.s-{_s} > td:first-child "
            f"{{ border-left: 4px solid {_c}; }}\ntable.grid td.w-{_s} "
            f"{{ background: {_c}; color: #fff; }}\n")
CSS += "td.status { font-weight: 700; color: #fff; text-align: center; }\n"

SCRIPT = """
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("rows-data").textContent);
  var RANK = {CRASH: 0, FAIL: 1, ERROR: 2, VACUOUS: 3, UNSUPPORTED: 4, SKIP: 5, PASS: 6};
  var rows = Array.prototype.slice.call(document.querySelectorAll("tr.row"));
  function value(i, k) {
    var v = (data.rows[i] || [])[k], codes = data.codes[k];
    return v === null || v === undefined ? "" : codes ? codes[v] : String(v);
  }
  var info = rows.map(function (tr) {
    var i = +tr.id.slice(1), text = [tr.textContent];
    data.cols.forEach(function (_, k) { text.push(value(i, k)); });
    return {i: i, s: (/\\bs-(\\w+)/.exec(tr.className) || ["", ""])[1],
            g: tr.closest("details").dataset.sect, key: text.join(" ").toLowerCase()};
  });
  var box = document.getElementById("filter"), sel = document.getElementById("status");
  var shown = document.getElementById("shown");
  var BAD = {fail: 1, error: 1, crash: 1};

  function wanted(status) {
    var v = sel.value;
    return v === "" || v === status || (v === "problems" && BAD[status] === 1);
  }
  function apply() {
    var words = box.value.toLowerCase().split(/\\s+/).filter(Boolean);
    var visible = {}, nsect = {}, count = 0;
    rows.forEach(function (tr, j) {
      var r = info[j];
      var ok = wanted(r.s) && words.every(function (w) { return r.key.indexOf(w) >= 0; });
      tr.classList.toggle("hid", !ok);
      var next = tr.nextElementSibling;
      if (next && next.classList.contains("detail")) next.classList.toggle("hid", !ok);
      if (ok) { visible[r.i] = 1; nsect[r.g] = 1; count++; }
    });
    document.querySelectorAll("tr.frow").forEach(function (tr) {
      tr.classList.toggle("hid", visible[tr.dataset.i] !== 1); });
    document.querySelectorAll("[data-sect]").forEach(function (el) {
      el.classList.toggle("hid", nsect[el.dataset.sect] !== 1); });
    shown.textContent = count + " of " + rows.length + " rows shown";
    if ((words.length || sel.value) && count > 0 && count <= 300) {
      document.querySelectorAll("details.sect").forEach(function (d) {
        if (nsect[d.dataset.sect] === 1) d.open = true; });
    }
  }
  var timer = null;
  box.addEventListener("input", function () {
    clearTimeout(timer); timer = setTimeout(apply, 120); });
  sel.addEventListener("change", apply);
  document.getElementById("open-all").addEventListener("click", function () {
    document.querySelectorAll("details.sect").forEach(function (d) { d.open = true; }); });
  document.getElementById("close-all").addEventListener("click", function () {
    document.querySelectorAll("details.sect").forEach(function (d) { d.open = false; }); });

  function toggleDetail(tr) {
    var next = tr.nextElementSibling;
    if (next && next.classList.contains("detail")) { next.remove(); return; }
    var i = +tr.id.slice(1);
    var d = document.createElement("tr"), td = document.createElement("td");
    var dl = document.createElement("dl");
    d.className = "detail"; td.colSpan = tr.cells.length;
    data.cols.forEach(function (name, k) {
      var v = value(i, k);
      if (v === "") return;
      var dt = document.createElement("dt"), dd = document.createElement("dd");
      dt.textContent = name; dd.textContent = v;
      dl.appendChild(dt); dl.appendChild(dd);
    });
    td.appendChild(dl); d.appendChild(td); tr.after(d);
  }
  function reveal(id) {
    var el = document.getElementById(id);
    if (!el) return;
    if (el.classList.contains("hid") || (el.closest(".hid") !== null)) {
      box.value = ""; sel.value = ""; apply();
    }
    for (var p = el.parentElement; p; p = p.parentElement) {
      if (p.tagName === "DETAILS") p.open = true;
    }
    el.scrollIntoView({block: "center"});
    el.classList.add("flash");
    setTimeout(function () { el.classList.remove("flash"); }, 1500);
  }
  function sortBy(th) {
    var table = th.closest("table"), tbody = table.tBodies[0], col = th.cellIndex;
    var desc = th.classList.contains("asc");
    th.parentNode.querySelectorAll("th").forEach(function (h) {
      h.classList.remove("asc", "desc"); });
    th.classList.add(desc ? "desc" : "asc");
    tbody.querySelectorAll("tr.detail").forEach(function (d) { d.remove(); });
    var key = function (tr) {
      var t = tr.cells[col] ? tr.cells[col].textContent.trim() : "";
      return RANK.hasOwnProperty(t) ? String(RANK[t]) : t; };
    var list = Array.prototype.slice.call(tbody.rows);
    list.sort(function (a, b) {
      var x = key(a), y = key(b), nx = parseFloat(x), ny = parseFloat(y);
      var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
      return desc ? -c : c; });
    list.forEach(function (tr) { tbody.appendChild(tr); });
  }
  document.addEventListener("click", function (ev) {
    var a = ev.target.closest("a");
    if (a) {
      var href = a.getAttribute("href") || "";
      if (href.charAt(0) === "#") {
        ev.preventDefault();
        history.pushState(null, "", href);
        reveal(decodeURIComponent(href.slice(1)));
      }
      return;
    }
    var svg = ev.target.closest("svg.plot");
    if (svg) {
      var rect = svg.getBoundingClientRect(), vb = svg.viewBox.baseVal;
      var x = (ev.clientX - rect.left) * vb.width / rect.width;
      var n = +svg.dataset.n, at = Math.floor((x - svg.dataset.left) / svg.dataset.width * n);
      if (at >= 0 && at < n) { history.pushState(null, "", "#r" + at); reveal("r" + at); }
      return;
    }
    var th = ev.target.closest("thead th");
    if (th) { sortBy(th); return; }
    var tr = ev.target.closest("tr.row");
    if (tr && !String(window.getSelection())) toggleDetail(tr);
  });
  window.addEventListener("hashchange", function () {
    reveal(decodeURIComponent(location.hash.slice(1))); });
  apply();
  if (location.hash) reveal(decodeURIComponent(location.hash.slice(1)));
})();
"""
