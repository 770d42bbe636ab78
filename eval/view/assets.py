"""The page's inline style and script (no network: the file opens from disk).

The script reads JSON from `<script type="application/json">` elements and builds every node of an
episode with `textContent` and `setAttribute` of constants and numbers: no untrusted text ever passes
through `innerHTML`. An episode's JSON is parsed only when its page is opened (`#e=<n>`).
"""

from __future__ import annotations

CSS = """
:root { --fg: #1d2330; --muted: #66707f; --line: #d9dee6; --bg: #f7f8fa; --accent: #2f5fd0;
  --won: #1f8a4c; --lost: #c23b3b; --err: #d9822b; --restore: #d9822b; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); margin: 0;
  background: var(--bg); }
header { background: #fff; border-bottom: 1px solid var(--line); padding: 12px 24px; }
header h1 { font-size: 18px; margin: 0; }
header .sub { color: var(--muted); font-size: 12px; word-break: break-all; }
main { padding: 16px 24px 48px; }
section { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 12px 16px;
  margin-bottom: 16px; }
h2 { font-size: 16px; margin: 0 0 8px; }
h3 { font-size: 14px; margin: 12px 0 6px; }
table { border-collapse: collapse; font-size: 13px; }
h2 { overflow-wrap: anywhere; }
#report table { max-width: 100%; }
#report table { font-size: 12px; }
#report th, #report td { padding: 3px 6px; }
#report td.name, #report td.ci { white-space: nowrap; }
.legend.names { overflow-wrap: anywhere; }
#report tr.named td { font-weight: 600; background: #f3f6fd; }
.legend.names ul { margin: 2px 0 8px; padding-left: 18px; }
.note { color: var(--muted); font-size: 12px; margin: 0 0 4px; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: var(--bg); position: sticky; top: 0; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
a { color: var(--accent); text-decoration: none; }
a:hover { text-decoration: underline; }
.plots img { max-width: 480px; margin: 4px 8px 4px 0; border: 1px solid var(--line); }
.filters { display: flex; flex-wrap: wrap; gap: 8px; align-items: center; margin-bottom: 8px; }
.filters label { font-size: 12px; color: var(--muted); }
.filters select, .filters input { font: inherit; padding: 2px 4px; }
.count { color: var(--muted); font-size: 12px; }
.ok { color: var(--won); font-weight: 600; }
.bad { color: var(--lost); font-weight: 600; }
.hidden { display: none; }
.scroll { overflow: auto; max-height: 70vh; }
.tree { overflow-x: auto; }
.tree svg text { font-size: 10px; fill: var(--fg); }
.tree svg text.row { fill: var(--muted); font-size: 11px; }
.tree .edge { stroke: #9aa3b2; stroke-width: 1.5; fill: none; }
.tree .restore { stroke: var(--restore); stroke-width: 2; stroke-dasharray: 5 3; fill: none; }
.tree circle { fill: #fff; stroke: #6b7688; stroke-width: 1.5; cursor: pointer; }
.tree circle.recover { fill: #fde7cf; }
.tree circle.continue { fill: #e6ecfa; }
.tree circle.won { fill: #d8f2e2; stroke: var(--won); }
.tree circle.lost { fill: #f7dcdc; stroke: var(--lost); }
.tree circle.error { stroke: var(--err); stroke-width: 3; }
.legend { color: var(--muted); font-size: 12px; }
.events { list-style: none; padding: 0; margin: 0; }
.event { border-left: 4px solid var(--line); padding: 4px 10px; margin: 6px 0; background: #fff; }
.event.step { border-color: #9aa3b2; }
.event.review { border-color: var(--accent); background: #f3f6fd; }
.event.locate, .event.reflect, .event.restore { border-color: var(--restore); background: #fff7ee; }
.event.guidance { border-color: #8a5cc2; background: #f6f1fc; }
.event.flash { outline: 2px solid var(--accent); }
.kind { display: inline-block; min-width: 88px; font-size: 11px; font-weight: 600; text-transform: uppercase;
  color: var(--muted); }
.at { color: var(--muted); font-size: 12px; margin-right: 8px; }
.action { font-family: ui-monospace, Menlo, Consolas, monospace; font-weight: 600; }
.obs { white-space: pre-wrap; word-break: break-word; color: #3a4352; margin: 2px 0 0; font-size: 13px; }
.kv { margin: 2px 0; }
.kv b { font-weight: 600; color: var(--muted); margin-right: 4px; }
.chip { display: inline-block; border: 1px solid var(--line); border-radius: 10px; padding: 0 7px;
  margin: 1px 3px 1px 0; font-size: 12px; }
.chip.on { border-color: var(--restore); background: #fde7cf; font-weight: 600; }
.changed { color: #8a5cc2; font-weight: 600; }
.sbs td { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; white-space: nowrap; }
.sbs th.me, .sbs td.me { background: #eef3ff; }
.sbs tr.diff td { background: #fde7cf; font-weight: 600; }
.sbs .mark { color: var(--lost); font-family: system-ui, sans-serif; }
.sbs .re { color: var(--restore); font-family: system-ui, sans-serif; }
"""

JS = r"""
(function () {
  "use strict";
  function byId(id) { return document.getElementById(id); }
  function json(id) { var e = byId(id); return e ? JSON.parse(e.textContent) : null; }
  var META = json("rir-meta");
  var COLS = {};
  META.columns.forEach(function (c, i) { COLS[c] = i; });
  var cache = {};
  function episode(i) {
    if (!(i in cache)) {
      var ep = json("ep-" + i);
      ep.actions = ep.events.filter(function (e) { return e.kind === "step"; }).map(function (e) { return e.action; });
      cache[i] = ep;
    }
    return cache[i];
  }

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    return e;
  }
  function add(parent, child) { parent.appendChild(child); return child; }
  function svg(tag, attrs) {
    var e = document.createElementNS("http://www.w3.org/2000/svg", tag);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, String(attrs[k])); });
    return e;
  }
  function link(i, text) { var a = el("a", "", text); a.setAttribute("href", "#e=" + Number(i)); return a; }
  function kv(parent, key, value) {
    var p = add(parent, el("div", "kv"));
    add(p, el("b", "", key));
    add(p, document.createTextNode(value === null || value === undefined ? "-" : String(value)));
    return p;
  }
  function list(parent, key, items) {
    if (!items || !items.length) { return; }
    add(parent, el("div", "kv")).appendChild(el("b", "", key));
    var ul = add(parent, el("ul"));
    items.forEach(function (x) { add(ul, el("li", "", x)); });
  }
  function outcome(success) { return el("span", success ? "ok" : "bad", success ? "success" : "failure"); }

  // --- index -------------------------------------------------------------------------------------
  var FILTERS = ["method", "controller", "task", "outcome"];
  var LIMIT = 500;
  var shown = LIMIT;
  function value(row, name) {
    return name === "outcome" ? (row[COLS.success] ? "success" : "failure") : String(row[COLS[name]]);
  }
  function setupFilters() {
    FILTERS.forEach(function (name) {
      var select = byId("f-" + name);
      var seen = {};
      META.rows.forEach(function (r) { seen[value(r, name)] = true; });
      Object.keys(seen).sort().forEach(function (v) { var o = add(select, el("option", "", v)); o.value = v; });
      select.addEventListener("change", function () { shown = LIMIT; renderIndex(); });
    });
    byId("f-id").addEventListener("input", function () { shown = LIMIT; renderIndex(); });
    byId("more").addEventListener("click", function () { shown += LIMIT * 4; renderIndex(); });
  }
  function matching() {
    var want = {};
    FILTERS.forEach(function (name) { want[name] = byId("f-" + name).value; });
    var text = byId("f-id").value.toLowerCase();
    var out = [];
    META.rows.forEach(function (r, i) {
      for (var k = 0; k < FILTERS.length; k++) {
        var name = FILTERS[k];
        if (want[name] && value(r, name) !== want[name]) { return; }
      }
      if (text && String(r[COLS.episode_id]).toLowerCase().indexOf(text) < 0) { return; }
      out.push(i);
    });
    return out;
  }
  function renderIndex() {
    var rows = matching();
    var body = byId("rows");
    body.textContent = "";
    rows.slice(0, shown).forEach(function (i) {
      var r = META.rows[i];
      var tr = add(body, el("tr"));
      add(tr, el("td")).appendChild(link(i, r[COLS.episode_id]));
      add(tr, el("td", "", r[COLS.method_key]));
      add(tr, el("td", "", r[COLS.task]));
      add(tr, el("td", "num", r[COLS.variation]));
      add(tr, el("td", "num", r[COLS.seed]));
      add(tr, el("td")).appendChild(outcome(r[COLS.success]));
      add(tr, el("td", "num", r[COLS.score]));
      add(tr, el("td", "num", r[COLS.env_steps]));
      add(tr, el("td", "num", r[COLS.rollbacks]));
      add(tr, el("td", "", r[COLS.stop_reason]));
    });
    byId("count").textContent = rows.length + " of " + META.rows.length + " episodes" +
      (rows.length > shown ? " (first " + shown + " listed)" : "");
    byId("more").classList.toggle("hidden", rows.length <= shown);
  }

  // --- episode: the tree --------------------------------------------------------------------------
  var REVIEWS = { recover: "recover", "continue": "continue" };  // a review's class: known decisions only
  function drawTree(parent, tree, events) {
    var box = add(parent, el("div", "tree"));
    var s = add(box, svg("svg", { width: tree.width, height: tree.height, viewBox: "0 0 " + tree.width + " " +
      tree.height, role: "img" }));
    var defs = add(s, svg("defs", {}));
    var marker = add(defs, svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7,
      markerHeight: 7, orient: "auto-start-reverse" }));
    add(marker, svg("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#d9822b" }));
    tree.rows.forEach(function (r, row) {
      var t = add(s, svg("text", { x: 4, y: r.y + 4, "class": "row" }));
      t.textContent = "branch " + (row + 1);
      add(t, svg("title", {})).textContent = r.label;
    });
    var nodes = tree.nodes;
    tree.edges.forEach(function (e) {
      var a = nodes[e[0]], b = nodes[e[1]];
      var d = a.y === b.y ? "M " + a.x + " " + a.y + " L " + b.x + " " + b.y :
        "M " + a.x + " " + a.y + " L " + a.x + " " + b.y + " L " + b.x + " " + b.y;
      add(s, svg("path", { d: d, "class": "edge" }));
    });
    tree.restores.forEach(function (r) {
      // Down into the gap under the branch it left, back left, then up into the checkpoint from below.
      var a = nodes[r.from], b = nodes[r.to];
      var gap = a.y + 21, side = b.x + 13;
      var d = "M " + a.x + " " + (a.y + 9) + " V " + gap + " H " + side + " V " + (b.y + 13) + " L " + (b.x + 7) + " " +
        (b.y + 7);
      var path = add(s, svg("path", { d: d, "class": "restore", "marker-end": "url(#arrow)" }));
      add(path, svg("title", {})).textContent = "restore from t=" + r.from_t + " to checkpoint t=" + r.to_t;
    });
    nodes.forEach(function (n, id) {
      var g = add(s, svg("g", {}));
      var cls = [n.flag, REVIEWS[n.review]].filter(Boolean).join(" ");
      add(g, svg("circle", { cx: n.x, cy: n.y, r: 9, "class": cls }));
      var label = add(g, svg("text", { x: n.x, y: n.y + 3.5, "text-anchor": "middle" }));
      label.textContent = String(n.t);
      var tip = "t=" + n.t + (id ? ": " + (n.ev >= 0 ? events[n.ev].action : "?") : " (start)") +
        (n.flag ? " [" + n.flag + "]" : "") +
        (n.review ? " [review: " + n.review + "]" : "");
      add(g, svg("title", {})).textContent = tip;
      if (n.ev >= 0) { g.addEventListener("click", function () { reveal("ev-" + Number(n.ev)); }); }
    });
    var legend = add(parent, el("div", "legend"));
    legend.textContent = "Nodes are checkpoints (steps from the start); rows are branches; dashed arrows are " +
      "restores back to the checkpoint they restored. Green: won, red: lost, thick orange ring: the injected " +
      "error, orange fill: a review decided recover, blue fill: continue. Click a node for its step.";
  }
  function reveal(id) {
    var e = byId(id);
    if (!e) { return; }
    e.scrollIntoView({ block: "center" });
    e.classList.add("flash");
    setTimeout(function () { e.classList.remove("flash"); }, 1200);
  }

  // --- episode: the timeline ------------------------------------------------------------------------
  function failureBlock(parent, f) {
    if (!f) { return; }
    var box = add(parent, el("div", "kv"));
    add(box, el("b", "", "failure"));
    kv(box, "condition", f.condition);
    kv(box, "action", f.action);
    kv(box, "outcome", f.outcome);
    kv(box, "lesson", f.lesson);
  }
  function memoryBlock(parent, m) {
    var d = add(parent, el("details"));
    add(d, el("summary", "", "memory after it: " + m.failures.length + " failure(s), " + m.env_knowledge.length +
      " fact(s), " + m.milestones.length + " milestone(s), " + m.anchored.length + " anchored"));
    list(d, "env knowledge", m.env_knowledge);
    list(d, "milestones", m.milestones);
    m.failures.forEach(function (f) { failureBlock(d, f); });
    list(d, "notes", m.notes);
    list(d, "anchored", m.anchored.map(function (a) {
      return "'" + a.action + "' after " + a.prefix_len + " step(s)" + (a.after ? " (last: '" + a.after + "')" : "") +
        " - " + a.source;
    }));
  }
  var RENDER = {
    reset: function (e, b) { kv(b, "objective", e.objective); add(b, el("div", "obs", e.observation)); },
    step: function (e, b) {
      add(b, el("span", "action", e.action));
      add(b, el("span", "at", "  score " + e.score + (e.flag ? " [" + e.flag + "]" : "")));
      if (e.sql) { add(kv(b, "SQL", ""), el("code", "", e.sql)); }
      add(b, el("div", "obs", e.observation));
      list(b, "rows changed", e.changes);
    },
    review: function (e, b) {
      kv(b, "trigger", e.trigger);
      add(b, el("span", e.decision === "recover" ? "bad" : "ok", e.decision));
      kv(b, "reason", e.reason);
      kv(b, "margin", e.margin);
    },
    locate: function (e, b) {
      var p = add(b, el("div", "kv"));
      add(p, el("b", "", "segments offered"));
      e.segments.forEach(function (s, i) {
        add(p, el("span", i === e.segment ? "chip on" : "chip", "#" + i + " [" + s[0] + ", " + s[1] + "]"));
      });
      kv(b, "chosen segment", e.segment);
      kv(b, "restore point", "t=" + e.step);
    },
    reflect: function (e, b) {
      kv(b, "for the restore to", "t=" + e.restore_point);
      if (e.fallback) { add(b, el("div", "bad", "the reply did not parse: the empty reflection was kept")); }
      if (e.budget_spent) { add(b, el("div", "bad", "no model call was left for the reflection")); }
      failureBlock(b, e.reflection.failure);
      list(b, "env knowledge", e.reflection.env_knowledge);
      list(b, "milestones", e.reflection.milestones);
      memoryBlock(b, e.memory);
    },
    restore: function (e, b) {
      kv(b, "to checkpoint", "t=" + e.to);
      kv(b, "steps undone (k)", e.k === 0 ? "0 (state kept, memory only)" : e.k);
      if (e.first_error !== null) { kv(b, "abandoned branch's first injected error", "t=" + (e.first_error + 1)); }
    },
    guidance: function (e, b) {
      kv(b, "mode", e.mode);
      kv(b, "penalty", e.penalty === null ? "excluded" : e.penalty);
      var warned = e.warned.map(function (w, i) {
        return "'" + w + "'" + (e.reasons[i] ? ": " + e.reasons[i] : "") +
          (e.scores[i] !== undefined && e.scores[i] !== null ? " (log p " + e.scores[i] + ")" : "");
      });
      list(b, "warned", warned);
      kv(b, "unguided", e.unguided);
      kv(b, "chosen", e.chosen);
      add(b, el("div", e.changed ? "changed" : "at", e.changed ? "guidance changed the action" : "same action"));
    },
    respond: function (e, b) { add(b, el("div", "obs", e.text)); },
    rollback_call: function (e, b) { kv(b, "reason", e.reason); kv(b, "target", e.target); },
    tool_error: function (e, b) { add(b, el("div", "obs", e.message)); },
    locate_failed: function (e, b) { kv(b, "error", e.error); },
    locate_fallback: function (e, b) { kv(b, "asked for", e.asked); },
    restore_failed: function (e, b) { kv(b, "to", e.to); kv(b, "error", e.error); }
  };
  function drawEvents(parent, events) {
    var ol = add(parent, el("ol", "events"));
    events.forEach(function (e, i) {
      var known = Object.prototype.hasOwnProperty.call(RENDER, e.kind);
      var li = add(ol, el("li", "event " + (known ? e.kind : "other")));
      li.id = "ev-" + i;
      add(li, el("span", "kind", e.kind.replace(/_/g, " ")));
      add(li, el("span", "at", "t=" + e.t));
      var body = add(li, el("div"));
      if (known) { RENDER[e.kind](e, body); } else {
        (e.fields || []).forEach(function (f) { kv(body, f[0], f[1]); });
      }
    });
  }

  // --- episode: side by side ------------------------------------------------------------------------
  function drawSideBySide(parent, ep) {
    var group = META.groups[ep.group];
    var members = group.members.map(function (i) { return { i: i, ep: episode(i) }; });
    if (members.length < 2) {
      add(parent, el("p", "count", "No other method or controller ran this episode in this run."));
      return;
    }
    add(parent, el("p", "", "Actions in the order executed (abandoned branches included; \u21b6 marks a branch " +
      "that starts after a restore). " + (group.first_diff === null ? "Every method executed the same actions." :
      "They first differ at action " + (group.first_diff + 1) + " (highlighted).")));
    var wrap = add(parent, el("div", "scroll"));
    var table = add(wrap, el("table", "sbs"));
    var head = add(add(table, el("thead")), el("tr"));
    add(head, el("th", "num", "#"));
    members.forEach(function (m) {
      var r = META.rows[m.i];
      var th = add(head, el("th", m.i === ep.i ? "me" : ""));
      th.appendChild(link(m.i, r[COLS.method_key]));
      add(th, document.createTextNode(" "));
      th.appendChild(outcome(r[COLS.success]));
    });
    var body = add(table, el("tbody"));
    var longest = Math.max.apply(null, members.map(function (m) { return m.ep.actions.length; }));
    var restarts = members.map(function (m) {
      var at = {};
      m.ep.restarts.forEach(function (r) { at[r[0]] = r[1]; });
      return at;
    });
    for (var k = 0; k < longest; k++) {
      var tr = add(body, el("tr", k === group.first_diff ? "diff" : ""));
      add(tr, el("td", "num", k + 1));
      members.forEach(function (m, j) {
        var td = add(tr, el("td", m.i === ep.i ? "me" : ""));
        if (k in restarts[j]) { add(td, el("span", "re", "\u21b6 t=" + restarts[j][k] + " ")); }
        if (k < m.ep.actions.length) { add(td, document.createTextNode(m.ep.actions[k])); }
        if (k === group.first_diff && j === 0) { add(td, el("span", "mark", "  \u25c0 first difference")); }
      });
    }
  }

  // --- episode page ---------------------------------------------------------------------------------
  function showEpisode(i) {
    var ep = episode(i);
    var root = byId("episode");
    root.textContent = "";
    var top = add(root, el("section"));
    add(top, el("p")).appendChild(el("a", "", "\u2190 all episodes")).setAttribute("href", "#index");
    add(top, el("h2", "", META.rows[i][COLS.episode_id]));
    var meta = add(top, el("table"));
    ep.meta.forEach(function (pair) {
      var tr = add(meta, el("tr"));
      add(tr, el("th", "", pair[0]));
      add(tr, el("td", "", pair[1]));
    });
    kv(top, "objective", ep.objective);
    var tree = add(root, el("section"));
    add(tree, el("h2", "", "Branch tree"));
    drawTree(tree, ep.tree, ep.events);
    var sbs = add(root, el("section"));
    add(sbs, el("h2", "", "The same episode under every method and controller"));
    drawSideBySide(sbs, ep);
    var events = add(root, el("section"));
    add(events, el("h2", "", "Timeline"));
    drawEvents(events, ep.events);
    byId("index").classList.add("hidden");
    root.classList.remove("hidden");
    window.scrollTo(0, 0);
  }
  function showIndex() {
    byId("episode").classList.add("hidden");
    byId("index").classList.remove("hidden");
  }
  function route() {
    var m = /^#e=(\d+)$/.exec(window.location.hash);
    var i = m ? Number(m[1]) : (window.location.hash ? -1 : META.focus);
    if (i !== null && i >= 0 && i < META.rows.length) { showEpisode(i); } else { showIndex(); }
  }
  setupFilters();
  renderIndex();
  window.addEventListener("hashchange", route);
  route();
})();
"""
