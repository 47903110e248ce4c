// runnel status page: polls /status and /status/history every second and
// renders the job graph, charts and tables. Plain JS and SVG, no library.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#1f6feb", "#1a7f37", "#cf222e", "#bf8700", "#8250df", "#0a7e8c", "#d4560b", "#57606a",
  "#e85aad", "#3b8f2e", "#6e40c9", "#b35900"];
const MAX_WINDOW_MS = 5 * 60 * 1000; // charts show at most the last five minutes
const MIN_WINDOW_MS = 30 * 1000;

const $ = (id) => document.getElementById(id);

function el(tag, attrs, text) {
  const e = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function fmtInt(n) {
  if (n === undefined || n === null || n < 0) return "–";
  return Math.round(n).toLocaleString("en-US");
}

function fmtShort(n) {
  if (n >= 1e9) return (n / 1e9).toFixed(1) + "G";
  if (n >= 1e6) return (n / 1e6).toFixed(1) + "M";
  if (n >= 1e4) return (n / 1e3).toFixed(1) + "k";
  if (n >= 100 || n === 0) return String(Math.round(n));
  return n.toFixed(n >= 10 ? 1 : 2);
}

function fmtBytes(b) {
  if (!b) return "0 B";
  const u = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return (i ? b.toFixed(1) : b) + " " + u[i];
}

function fmtDur(ns) {
  if (ns >= 1e9) return (ns / 1e9).toFixed(2) + " s";
  if (ns >= 1e6) return (ns / 1e6).toFixed(1) + " ms";
  return (ns / 1e3).toFixed(0) + " µs";
}

// fmtWM formats a watermark (RFC 3339 from the JSON; absent: none yet).
function fmtWM(s) {
  if (!s) return "none yet";
  const d = new Date(s);
  if (isNaN(d)) return "–";
  if (d.getUTCFullYear() >= 2262) return "end of input";
  return d.toISOString().replace("T", " ").replace("Z", " UTC");
}

function wmCell(s, extra) {
  const c = td(fmtWM(s), "wm" + (s ? "" : " none"));
  if (extra) c.append(extra);
  return c;
}

function tag(text, cls) { return el("span", { class: "tag " + cls }, text); }

function fmtTime(s) {
  const d = new Date(s);
  return isNaN(d) || d.getFullYear() < 2000 ? "–" : d.toLocaleTimeString("en-GB");
}

function fillTable(id, rows, emptyText, cols) {
  const tb = $(id).tBodies[0];
  tb.replaceChildren();
  if (!rows.length) {
    const tr = el("tr", { class: "empty" });
    tr.append(el("td", { colspan: cols }, emptyText));
    tb.append(tr);
    return;
  }
  for (const r of rows) tb.append(r);
}

function td(text, cls) { return el("td", cls ? { class: cls } : {}, text); }

// ---- rates from the history ----------------------------------------------

// rates returns, per operator UID, [t, records/s] points: sources by
// records out, the others by records in.
function rates(hist, sources) {
  const out = {};
  const s = hist.samples || [];
  for (let i = 1; i < s.length; i++) {
    const dt = (s[i].t - s[i - 1].t) / 1000;
    if (dt <= 0) continue;
    const cur = s[i], prev = s[i - 1];
    for (const uid of Object.keys(cur.in || {})) {
      const key = sources.has(uid) ? "out" : "in";
      const a = (cur[key] || {})[uid], b = (prev[key] || {})[uid];
      if (a === undefined || b === undefined) continue;
      (out[uid] = out[uid] || []).push([cur.t, Math.max(0, (a - b) / dt)]);
    }
  }
  return out;
}

function lagSeries(hist) {
  const out = {};
  for (const s of hist.samples || []) {
    for (const [k, v] of Object.entries(s.lag || {})) (out[k] = out[k] || []).push([s.t, v]);
  }
  return out;
}

// ---- line chart ------------------------------------------------------------

function niceMax(v) {
  if (v <= 0) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

// chartWindow is the time span the charts show: the history's span, at
// least 30 s, at most five minutes.
function chartWindow(hist, now) {
  const s = hist.samples || [];
  const span = s.length ? now - s[0].t : 0;
  return Math.min(MAX_WINDOW_MS, Math.max(MIN_WINDOW_MS, span));
}

function fmtAgo(ms) {
  if (ms <= 0) return "now";
  return ms % 60000 === 0 ? `-${ms / 60000}m` : `-${Math.round(ms / 1000)}s`;
}

function lineChart(svg, legend, series, now, windowMs) {
  const W = svg.clientWidth || 600, H = svg.clientHeight || 220;
  const L = 52, R = 12, T = 10, B = 24;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.replaceChildren();
  legend.replaceChildren();
  const names = Object.keys(series).sort();
  const t0 = now - windowMs;
  let ymax = 0;
  for (const n of names) for (const [t, v] of series[n]) if (t >= t0) ymax = Math.max(ymax, v);
  ymax = niceMax(ymax * 1.05);
  const x = (t) => L + ((t - t0) / windowMs) * (W - L - R);
  const y = (v) => T + (1 - v / ymax) * (H - T - B);
  for (let i = 0; i <= 4; i++) {
    const v = (ymax * i) / 4;
    svg.append(el("svg:line", { class: "grid", x1: L, x2: W - R, y1: y(v), y2: y(v) }));
    svg.append(el("svg:text", { class: "axis", x: L - 6, y: y(v) + 4, "text-anchor": "end" }, fmtShort(v)));
  }
  const step = [5000, 10000, 15000, 30000, 60000].find((st) => windowMs / st <= 6) || 60000;
  for (let ago = 0; ago <= windowMs; ago += step) {
    svg.append(el("svg:line", { class: "grid", x1: x(now - ago), x2: x(now - ago), y1: T, y2: H - B, "stroke-dasharray": "2 4" }));
    svg.append(el("svg:text", { class: "axis", x: x(now - ago), y: H - 6, "text-anchor": ago === 0 ? "end" : "middle" }, fmtAgo(ago)));
  }
  if (!names.length) {
    svg.append(el("svg:text", { class: "nodata", x: W / 2, y: H / 2, "text-anchor": "middle" }, "no data yet"));
    return;
  }
  names.forEach((n, i) => {
    const color = COLORS[i % COLORS.length];
    const pts = series[n].filter(([t]) => t >= t0);
    if (pts.length) {
      const d = pts.map(([t, v], j) => `${j ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
      svg.append(el("svg:path", { class: "line", d, stroke: color, "data-series": n }));
      if (pts.length === 1) svg.append(el("svg:circle", { cx: x(pts[0][0]), cy: y(pts[0][1]), r: 3, fill: color }));
    }
    const last = pts.length ? pts[pts.length - 1][1] : undefined;
    const item = el("span", { "data-series": n });
    item.append(el("i", { class: "dot", style: `background:${color}` }), document.createTextNode(`${n} `));
    item.append(el("b", {}, last === undefined ? "–" : fmtShort(last)));
    legend.append(item);
  });
}

// ---- job graph -------------------------------------------------------------

function drawGraph(svg, graph, ops, rateNow) {
  svg.replaceChildren();
  let nodes = graph && graph.nodes && graph.nodes.length ? graph.nodes : ops.map((o) => ({ uid: o.uid, kind: o.kind, parallelism: 0 }));
  const edges = (graph && graph.edges) || [];
  const depth = {};
  nodes.forEach((n) => (depth[n.uid] = 0));
  for (let pass = 0; pass < nodes.length; pass++) {
    let changed = false;
    for (const e of edges) {
      if (depth[e.from] !== undefined && depth[e.to] !== undefined && depth[e.to] < depth[e.from] + 1) {
        depth[e.to] = depth[e.from] + 1;
        changed = true;
      }
    }
    if (!changed) break;
  }
  if (!edges.length) nodes.forEach((n, i) => (depth[n.uid] = i));
  const cols = {};
  for (const n of nodes) (cols[depth[n.uid]] = cols[depth[n.uid]] || []).push(n);
  const NW = 170, NH = 58, GX = 70, GY = 22, PAD = 12;
  const ncols = Math.max(...Object.keys(cols).map(Number)) + 1;
  const maxRows = Math.max(...Object.values(cols).map((c) => c.length));
  const W = PAD * 2 + ncols * NW + (ncols - 1) * GX, H = PAD * 2 + maxRows * NH + (maxRows - 1) * GY;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("width", W);
  svg.setAttribute("height", H);
  const pos = {};
  for (const [c, list] of Object.entries(cols)) {
    const off = ((maxRows - list.length) * (NH + GY)) / 2;
    list.forEach((n, r) => (pos[n.uid] = { x: PAD + c * (NW + GX), y: PAD + off + r * (NH + GY) }));
  }
  const defs = el("svg:defs");
  for (const [k, c] of [["forward", "#98a2b3"], ["keyed", "#1f6feb"], ["dead-letter", "#cf222e"], ["side-output", "#8250df"]]) {
    const m = el("svg:marker", { id: "arrow-" + k, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" });
    m.append(el("svg:path", { d: "M0,0 L10,5 L0,10 z", fill: c }));
    defs.append(m);
  }
  svg.append(defs);
  for (const e of edges) {
    const a = pos[e.from], b = pos[e.to];
    if (!a || !b) continue;
    const x1 = a.x + NW, y1 = a.y + NH / 2, x2 = b.x, y2 = b.y + NH / 2, mx = (x1 + x2) / 2;
    const p = el("svg:path", { class: "edge " + e.kind, d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2 - 2},${y2}`,
      "marker-end": `url(#arrow-${e.kind in { keyed: 1, "dead-letter": 1, "side-output": 1 } ? e.kind : "forward"})`,
      "data-from": e.from, "data-to": e.to });
    p.append(el("svg:title", {}, `${e.from} → ${e.to} (${e.kind})`));
    svg.append(p);
  }
  const statsOf = Object.fromEntries(ops.map((o) => [o.uid, o]));
  for (const n of nodes) {
    const p = pos[n.uid];
    const cls = n.kind === "source" ? "source" : n.kind === "sink" ? "sink" :
      ["keyed-process", "reduce", "aggregate"].includes(n.kind) ? "keyed" : "";
    const g = el("svg:g", { class: "node " + cls, transform: `translate(${p.x},${p.y})`, "data-uid": n.uid });
    g.append(el("svg:rect", { width: NW, height: NH, rx: 8 }));
    g.append(el("svg:text", { class: "uid", x: 10, y: 19 }, n.uid));
    g.append(el("svg:text", { class: "kind", x: 10, y: 35 }, n.kind + (n.parallelism ? ` ×${n.parallelism}` : "")));
    const s = statsOf[n.uid];
    const r = rateNow[n.uid];
    const line = s ? `${fmtShort(n.kind === "source" ? s.recordsOut : s.recordsIn)} rec` + (r !== undefined ? ` · ${fmtShort(r)}/s` : "") : "";
    g.append(el("svg:text", { class: "rate", x: 10, y: 50 }, line));
    g.append(el("svg:title", {}, `${n.uid} (${n.kind})` + (s ? `\nin ${s.recordsIn} · out ${s.recordsOut} · rejected ${s.recordsRejected} · late ${s.recordsLate || 0}` +
      `\nwatermark ${fmtWM(s.watermark)}` : "")));
    svg.append(g);
  }
}

// ---- refresh ---------------------------------------------------------------

async function getJSON(path) {
  const r = await fetch(path, { cache: "no-store" });
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

async function refresh() {
  let st, hist;
  try {
    [st, hist] = await Promise.all([getJSON("/status"), getJSON("/status/history")]);
  } catch (e) {
    $("state").textContent = "unreachable";
    $("state").className = "pill down";
    $("updated").textContent = String(e.message || e);
    return;
  }
  const now = Date.now();
  document.title = `${st.job} · runnel`;
  $("job").textContent = st.job;
  $("state").textContent = st.state;
  $("state").className = "pill " + st.state;
  $("updated").textContent = "updated " + new Date(now).toLocaleTimeString("en-GB");

  const ops = st.operators || [];
  const sources = new Set(ops.filter((o) => o.kind === "source").map((o) => o.uid));
  const rs = rates(hist, sources);
  const rateNow = {};
  for (const [uid, pts] of Object.entries(rs)) rateNow[uid] = pts[pts.length - 1][1];

  // Summary.
  const read = ops.filter((o) => sources.has(o.uid)).reduce((a, o) => a + o.recordsOut, 0);
  const rate = [...sources].reduce((a, u) => a + (rateNow[u] || 0), 0);
  const lags = (st.lag || []).filter((l) => l.lag >= 0);
  $("sum-read").textContent = fmtInt(read);
  $("sum-rate").textContent = fmtShort(rate) + " rec/s";
  $("sum-lag").textContent = lags.length ? fmtInt(lags.reduce((a, l) => a + l.lag, 0)) : "–";
  const cps = st.checkpoints || [];
  $("sum-cp").textContent = cps.length ? `#${cps[0].id} ${cps[0].result.split(":")[0]}` : "–";
  $("sum-dead").textContent = fmtInt(ops.reduce((a, o) => a + o.recordsRejected, 0));
  $("sum-late").textContent = fmtInt(ops.reduce((a, o) => a + (o.recordsLate || 0), 0));

  drawGraph($("graph"), st.graph, ops, rateNow);
  // Charts end at the newest sample (the job's clock), not the browser's.
  const samples = hist.samples || [];
  const tEnd = samples.length ? samples[samples.length - 1].t : now;
  const win = chartWindow(hist, tEnd);
  lineChart($("lag-chart"), $("lag-legend"), lagSeries(hist), tEnd, win);
  lineChart($("rate-chart"), $("rate-legend"), rs, tEnd, win);

  // Splits: lag and watermark from the split gauges, offsets from the
  // last checkpoint (decoded as runnel checkpoint inspect shows them).
  const committed = Object.fromEntries((st.splits || []).map((s) => [s.source + "/" + s.split, s.offset || s.committedOffset]));
  const live = Object.fromEntries((st.lag || []).map((l) => [l.source + "/" + l.split, l]));
  const keys = new Set([...Object.keys(live), ...Object.keys(committed)]);
  fillTable("splits", [...keys].sort().map((k) => {
    const i = k.indexOf("/");
    const tr = el("tr", { "data-split": k });
    const l = live[k];
    const wm = l ? wmCell(l.watermark, l.idle ? tag("idle", "idle") : null) : td("–");
    if (l && l.idle) tr.setAttribute("data-idle", "true");
    tr.append(td(k.slice(0, i)), td(k.slice(i + 1)), td(fmtInt(l ? l.lag : undefined), "num lag"), wm, td(committed[k] || "–", "mono"));
    return tr;
  }), "no split yet", 5);

  fillTable("operators", ops.map((o) => {
    const tr = el("tr", { "data-uid": o.uid });
    const late = o.recordsLate || 0;
    const held = td("", "held");
    for (const h of o.heldBy || []) {
      const item = el("span", { class: "holder", "data-split": h.source + "/" + h.split }, h.source + "/" + h.split);
      item.append(h.watermark ? tag(fmtWM(h.watermark), "at") : tag("no watermark", "nowm"));
      if (held.childNodes.length) held.append(document.createTextNode(" "));
      held.append(item);
    }
    if (!held.childNodes.length) held.textContent = "–";
    tr.append(td(o.uid), td(o.kind), td(fmtInt(o.recordsIn), "num"), td(fmtInt(o.recordsOut), "num"),
      td(fmtInt(o.recordsRejected), "num"), td(fmtInt(late), "num late" + (late > 0 ? " some" : "")),
      td(rateNow[o.uid] === undefined ? "–" : fmtShort(rateNow[o.uid]), "num"), wmCell(o.watermark), held);
    return tr;
  }), "no operator", 9);

  fillTable("checkpoints", cps.map((c) => {
    const tr = el("tr", { "data-id": c.id });
    const res = c.result.split(":")[0];
    const rc = td(res, "res " + res);
    if (c.result !== res) rc.title = c.result;
    tr.append(td(String(c.id), "num"), td(fmtTime(c.time)), td(fmtDur(c.durationNs), "num"), td(fmtBytes(c.bytes), "num"),
      td(fmtInt(c.stateChanges), "num"), rc);
    return tr;
  }), "no checkpoint yet", 6);

  fillTable("deadletters", (st.deadLetters || []).map((d) => {
    const tr = el("tr");
    tr.append(td(fmtTime(d.time)), td(d.operator), td(d.policy), td(d.reason), td(d.error, "err"));
    return tr;
  }), "no rejected record", 5);
}

refresh();
setInterval(refresh, 1000);
