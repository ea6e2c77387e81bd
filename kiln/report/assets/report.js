"use strict";
// Kiln build report: draws the data html.py embeds. No network, no library:
// timelines on <canvas>, graphs as SVG with coordinates laid out in Python.
(function () {
  const K = (window.kiln = { ready: false, timelines: {}, instances: {} });
  const SVG = "http://www.w3.org/2000/svg";

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else e.setAttribute(k, v);
    }
    for (const kid of kids) e.append(kid);
    return e;
  }
  function svgEl(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    return e;
  }
  function fmt(v, digits) {
    if (v === null || v === undefined) return "";
    if (typeof v === "number" && !Number.isInteger(v)) return v.toFixed(digits === undefined ? 3 : digits);
    return String(v);
  }

  async function inflate(b64) {
    const raw = atob(b64);
    const bytes = new Uint8Array(raw.length);
    for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return JSON.parse(await new Response(stream).text());
  }

  // -- timeline ------------------------------------------------------------------
  // data: {lanes, lane[], start[], end[], colour[] (index into colours), colours,
  //        utilization?, critical?, unit?: "cycles"|"ms"}; label(i) -> tooltip text
  class Timeline {
    constructor(host, data, label, onSelect) {
      this.d = data;
      this.label = label;
      this.onSelect = onSelect || (() => {});
      this.n = data.start.length;
      let maxEnd = 0;
      for (let i = 0; i < this.n; i++) if (data.end[i] > maxEnd) maxEnd = data.end[i];
      this.end = Math.max(1, maxEnd);
      this.t0 = 0;
      this.t1 = this.end;
      this.laneH = 18;
      this.top = 20;
      this.labelW = 150;
      this.selected = new Set();
      this.critical = new Set(data.critical || []);
      // per lane, instruction indices sorted by start (a unit runs one at a time)
      this.byLane = data.lanes.map(() => []);
      for (let i = 0; i < this.n; i++) this.byLane[data.lane[i]].push(i);
      for (const l of this.byLane) l.sort((a, b) => data.start[a] - data.start[b] || a - b);
      this.byColour = data.colours.map(() => []);
      for (let i = 0; i < this.n; i++) this.byColour[data.colour[i]].push(i);
      this.canvas = el("canvas");
      this.tip = el("div", { class: "tooltip" });
      host.append(this.canvas, this.tip);
      const width = Math.max(600, (host.clientWidth || 1000) - 4);
      const height = this.top + this.laneH * data.lanes.length + 4;
      const dpr = window.devicePixelRatio || 1;
      this.w = width;
      this.h = height;
      this.canvas.width = width * dpr;
      this.canvas.height = height * dpr;
      this.canvas.style.width = width + "px";
      this.canvas.style.height = height + "px";
      this.ctx = this.canvas.getContext("2d");
      this.ctx.scale(dpr, dpr);
      this.bind();
      this.draw();
    }
    scale() {
      return (this.w - this.labelW - 8) / Math.max(1e-9, this.t1 - this.t0);
    }
    xOf(t) {
      return this.labelW + (t - this.t0) * this.scale();
    }
    draw() {
      const c = this.ctx, d = this.d, s = this.scale();
      c.clearRect(0, 0, this.w, this.h);
      c.font = "11px monospace";
      c.textBaseline = "middle";
      // lanes, labels and utilisation
      for (let l = 0; l < d.lanes.length; l++) {
        const y = this.top + l * this.laneH;
        c.fillStyle = l % 2 ? "#f6f6f6" : "#fff";
        c.fillRect(this.labelW, y, this.w - this.labelW, this.laneH);
        c.fillStyle = "#333";
        const util = d.utilization ? ` ${(100 * d.utilization[l]).toFixed(0)}%` : "";
        c.fillText(d.lanes[l] + util, 4, y + this.laneH / 2);
      }
      // axis
      c.fillStyle = "#555";
      const span = this.t1 - this.t0;
      const step = Math.pow(10, Math.floor(Math.log10(span / 5 || 1)));
      const tick = span / step > 10 ? step * 2 : step;
      for (let t = Math.ceil(this.t0 / tick) * tick; t <= this.t1; t += tick) {
        const x = this.xOf(t);
        if (x < this.labelW) continue;
        c.fillRect(x, this.top - 4, 1, 4);
        c.fillText(fmt(+t.toPrecision(6)), x + 2, 8);
      }
      // bars, one fill colour at a time, clipped to the plot area
      c.save();
      c.beginPath();
      c.rect(this.labelW, 0, this.w - this.labelW, this.h);
      c.clip();
      let drawn = 0;
      for (let k = 0; k < this.byColour.length; k++) {
        c.fillStyle = d.colours[k];
        for (const i of this.byColour[k]) {
          if (d.end[i] < this.t0 || d.start[i] > this.t1) continue;
          const x = this.xOf(d.start[i]);
          const w = Math.max(1, (d.end[i] - d.start[i]) * s);
          c.fillRect(x, this.top + d.lane[i] * this.laneH + 2, w, this.laneH - 4);
          drawn++;
        }
      }
      // the critical path: a red rule under its bars
      c.fillStyle = "#d62728";
      for (const i of this.critical) {
        if (d.end[i] < this.t0 || d.start[i] > this.t1) continue;
        const w = Math.max(1, (d.end[i] - d.start[i]) * s);
        c.fillRect(this.xOf(d.start[i]), this.top + (d.lane[i] + 1) * this.laneH - 3, w, 2);
      }
      let lit = 0;
      c.strokeStyle = "#111";
      c.lineWidth = 2;
      for (const i of this.selected) {
        if (d.end[i] < this.t0 || d.start[i] > this.t1) continue;
        const w = Math.max(3, (d.end[i] - d.start[i]) * s);
        c.fillStyle = "#ffd400";
        c.fillRect(this.xOf(d.start[i]), this.top + d.lane[i] * this.laneH + 2, w, this.laneH - 4);
        c.strokeRect(this.xOf(d.start[i]), this.top + d.lane[i] * this.laneH + 1, w, this.laneH - 2);
        lit++;
      }
      // what a selected instruction waited for: a line from each dependency's end
      if (d.deps && this.selected.size <= 64) {
        c.strokeStyle = "#333";
        c.lineWidth = 1;
        c.beginPath();
        const mid = (i) => this.top + (d.lane[i] + 0.5) * this.laneH;
        for (const i of this.selected) {
          for (let k = d.dep_offsets[i]; k < d.dep_offsets[i + 1]; k++) {
            const j = d.deps[k];
            c.moveTo(this.xOf(d.end[j]), mid(j));
            c.lineTo(this.xOf(d.start[i]), mid(i));
          }
        }
        c.stroke();
      }
      c.restore();
      this.canvas.dataset.bars = drawn;
      this.canvas.dataset.highlighted = lit;
    }
    hit(x, y) {
      const l = Math.floor((y - this.top) / this.laneH);
      if (l < 0 || l >= this.byLane.length || x < this.labelW) return -1;
      const idx = this.byLane[l], d = this.d, s = this.scale();
      let lo = 0, hi = idx.length - 1, best = -1;
      const t = this.t0 + (x - this.labelW) / s;
      while (lo <= hi) {
        const mid = (lo + hi) >> 1;
        if (d.start[idx[mid]] <= t) { best = mid; lo = mid + 1; } else hi = mid - 1;
      }
      for (let j = best; j >= 0 && j > best - 4; j--) {  // a narrow bar is drawn 1px wide
        const i = idx[j];
        const x0 = this.xOf(d.start[i]), x1 = x0 + Math.max(1, (d.end[i] - d.start[i]) * s);
        if (x >= x0 - 0.5 && x <= x1 + 0.5) return i;
      }
      return -1;
    }
    barCentre(i) {
      const r = this.canvas.getBoundingClientRect(), d = this.d;
      const w = Math.max(1, (d.end[i] - d.start[i]) * this.scale());
      return { x: r.left + this.xOf(d.start[i]) + w / 2, y: r.top + this.top + (d.lane[i] + 0.5) * this.laneH };
    }
    select(set) {
      this.selected = new Set(set);
      this.draw();
    }
    bind() {
      const cv = this.canvas;
      let drag = null;
      const pos = (e) => { const r = cv.getBoundingClientRect(); return [e.clientX - r.left, e.clientY - r.top]; };
      cv.addEventListener("mousemove", (e) => {
        const [x, y] = pos(e);
        if (drag) {
          const dt = (drag.x - x) / this.scale();
          this.t0 = drag.t0 + dt; this.t1 = drag.t1 + dt; drag.moved = true;
          this.draw();
          return;
        }
        const i = this.hit(x, y);
        cv.dataset.hover = i;
        if (i < 0) { this.tip.style.display = "none"; return; }
        this.tip.textContent = this.label(i);
        this.tip.style.display = "block";
        this.tip.style.left = e.clientX + 12 + "px";
        this.tip.style.top = e.clientY + 12 + "px";
      });
      cv.addEventListener("mouseleave", () => { this.tip.style.display = "none"; drag = null; });
      cv.addEventListener("mousedown", (e) => { const [x] = pos(e); drag = { x, t0: this.t0, t1: this.t1, moved: false }; });
      cv.addEventListener("mouseup", (e) => {
        const moved = drag && drag.moved;
        drag = null;
        if (moved) return;
        const [x, y] = pos(e);
        const i = this.hit(x, y);
        if (i >= 0) this.onSelect([i]);
      });
      cv.addEventListener("dblclick", () => { this.t0 = 0; this.t1 = this.end; this.draw(); });
      cv.addEventListener("wheel", (e) => {
        e.preventDefault();
        const [x] = pos(e);
        const t = this.t0 + (x - this.labelW) / this.scale();
        const f = e.deltaY < 0 ? 0.8 : 1.25;
        const span = Math.max(2, (this.t1 - this.t0) * f);
        const frac = (t - this.t0) / (this.t1 - this.t0);
        this.t0 = t - frac * span; this.t1 = this.t0 + span;
        this.draw();
      }, { passive: false });
    }
  }

  // -- graphs (coordinates from Python) -------------------------------------------
  // layers run top to bottom, or left to right with `across` (the task DAG)
  function drawGraph(host, g, colourOf, onClick, across) {
    if (g.omitted) {
      host.append(el("p", { class: "hint", text: `${g.omitted} nodes: too many to draw; the timeline shows them.` }));
      return null;
    }
    const compact = g.nodes.length > (across ? 600 : 150);
    const nw = compact ? 10 : across ? 270 : 160, nh = compact ? 10 : 24, chars = across ? 40 : 24;
    const dx = compact ? 16 : nw + 10, dy = compact ? 26 : across ? 30 : 48;
    const X = (n) => (across ? n.y * (nw + 40) : n.x * dx), Y = (n) => (across ? n.x * dy : n.y * dy);
    let maxX = 0, maxY = 0;
    for (const n of g.nodes) { maxX = Math.max(maxX, X(n)); maxY = Math.max(maxY, Y(n)); }
    const svg = svgEl("svg", { width: maxX + nw + 20, height: maxY + nh + 20 });
    const cx = (n) => 10 + X(n) + nw / 2, cy = (n) => 10 + Y(n) + nh / 2;
    for (const [a, b] of g.edges) {
      const na = g.nodes[a], nb = g.nodes[b];
      const line = across
        ? { x1: cx(na) + nw / 2, y1: cy(na), x2: cx(nb) - nw / 2, y2: cy(nb) }
        : { x1: cx(na), y1: cy(na) + nh / 2, x2: cx(nb), y2: cy(nb) - nh / 2 };
      svg.append(svgEl("line", { class: "edge", ...line }));
    }
    const nodes = [];
    g.nodes.forEach((n, i) => {
      const grp = svgEl("g", { class: "node", "data-id": n.id });
      const fill = colourOf(n);
      if (compact) grp.append(svgEl("circle", { cx: cx(n), cy: cy(n), r: nw / 2, fill }));
      else {
        grp.append(svgEl("rect", { x: 10 + X(n), y: 10 + Y(n), width: nw, height: nh, rx: 4, fill, stroke: "#666" }));
        const t = svgEl("text", { x: 14 + X(n), y: 10 + Y(n) + 16 });
        const head = n.label.split("\n")[0];
        t.textContent = head.length > chars ? head.slice(0, chars - 1) + "\u2026" : head;
        grp.append(t);
      }
      const title = svgEl("title");
      title.textContent = n.label + (n.line ? `  (line ${n.line})` : "");
      grp.append(title);
      grp.addEventListener("click", () => onClick && onClick(n, i));
      svg.append(grp);
      nodes.push(grp);
    });
    host.append(svg);
    return nodes;
  }

  // -- one kernel instance -----------------------------------------------------------
  function renderInstance(section, d) {
    const name = d.name;
    const api = { name, section };
    K.instances[name] = api;
    if (d.diagnostic) {
      const diag = d.diagnostic;
      let text = diag.message || "";
      if (diag.file) text = `${diag.file}${diag.line ? ":" + diag.line : ""}: ${text}`;
      for (const k of ["expected", "found", "hint"]) if (diag[k]) text += `\n${k}: ${diag[k]}`;
      for (const note of diag.notes || []) text += `\nnote: ${note}`;
      section.append(el("h3", { text: `Build failed (${d.failed_task || ""})` }), el("div", { class: "diagnostic", text }));
    }
    const s = d.schedule;
    const instrLines = [], sourceLines = [], graphNodes = {};
    let timeline = null;
    const nodeOf = (i) => (s && s.node.length ? s.node[i] : -1);
    const nodeLine = (n) => (d.source ? d.source.node_lines[String(n)] : undefined);

    function select(instrs, from) {
      const set = new Set(instrs);
      const nodes = new Set([...set].map(nodeOf).filter((n) => n >= 0));
      if (from && from.nodes) for (const n of from.nodes) nodes.add(n);
      const lines = new Set([...nodes].map(nodeLine).filter((l) => l !== undefined));
      if (from && from.line !== undefined) lines.add(from.line);
      if (timeline) timeline.select(set);
      instrLines.forEach((e, i) => e.classList.toggle("hl", set.has(i)));
      for (const [line, e] of sourceLines) e.classList.toggle("hl", lines.has(line));
      for (const [id, e] of Object.entries(graphNodes.traced || {})) e.classList.toggle("hl", nodes.has(+id));
      for (const [id, e] of Object.entries(graphNodes.lir || {})) e.classList.toggle("hl", set.has(+id));
      section.dataset.selected = set.size;
      const first = instrLines[Math.min(...set)];
      if (first && from && from.scroll) first.scrollIntoView({ block: "nearest" });
    }
    api.select = select;

    if (d.summary) {
      const m = d.summary;
      section.append(el("p", { class: "mono", text:
        `makespan ${m.makespan_cycles} cycles · lower bound ${m.lower_bound_cycles} · ratio ${fmt(m.ratio)} · ` +
        `${m.instructions.total} instructions · SRAM peak ${m.sram.peak_bytes} B · busiest ${m.busiest_kind}` }));
    }
    if (s) {
      section.append(el("h3", { text: "Schedule" }));
      const legend = el("div", { class: "legend" });
      s.kinds.forEach((k, i) => { const sp = el("span"); sp.append(el("i", { style: `background:${s.colours[i]}` }), k); legend.append(sp); });
      const cp = el("span"); cp.append(el("i", { style: "background:#d62728" }), "critical path"); legend.append(cp);
      section.append(legend, el("p", { class: "hint", text: "wheel: zoom · drag: pan · double-click: reset · click a bar: select" }));
      const host = el("div", { class: "timeline" });
      section.append(host);
      const label = (i) => {
        const deps = s.deps.slice(s.dep_offsets[i], s.dep_offsets[i + 1]);
        const n = nodeOf(i), line = nodeLine(n);
        return `#${i} ${s.text[i]}\nunit ${s.lanes[s.lane[i]]} · cycles ${s.start[i]}–${s.end[i]} (${s.end[i] - s.start[i]})` +
          `\ndeps ${deps.length ? deps.map((x) => "#" + x).join(" ") : "none"}` +
          (n >= 0 ? `\ngraph node ${n}${line ? ", line " + line : ""}` : "");
      };
      timeline = new Timeline(host, { ...s, colour: s.kind }, label, (is) => select(is, { scroll: true }));
      timeline.canvas.dataset.instructions = s.start.length;
      K.timelines[name] = timeline;
    }
    if (d.source || d.visa) {
      section.append(el("h3", { text: "Source and vISA" }), el("p", { class: "hint", text: "click a source line to see what it produced, or a vISA instruction to see where it came from" }));
      const panes = el("div", { class: "panes" });
      section.append(panes);
      if (d.source) {
        const pane = el("div", { class: "pane source" });
        const mapped = new Set(Object.values(d.source.node_lines));
        d.source.lines.forEach((text, k) => {
          const line = d.source.first_line + k;
          const e = el("div", { class: "line src-line" + (mapped.has(line) ? " mapped" : ""), "data-line": line });
          e.append(el("span", { class: "lineno", text: line }), text);
          e.addEventListener("click", () => {
            const nodes = Object.entries(d.source.node_lines).filter(([, l]) => l === line).map(([n]) => +n);
            const ns = new Set(nodes);
            const instrs = [];
            if (s) for (let i = 0; i < s.node.length; i++) if (ns.has(s.node[i])) instrs.push(i);
            select(instrs, { nodes, line, scroll: true });
          });
          sourceLines.push([line, e]);
          pane.append(e);
        });
        panes.append(pane);
      }
      if (d.visa) {
        const pane = el("div", { class: "pane visa" });
        const first = d.visa.first_instr_line;
        const shown = Math.min(d.visa.lines.length, first + 5000);
        for (let k = 0; k < shown; k++) {
          const e = el("div", { class: "line visa-line", "data-line": k + 1 });
          e.append(el("span", { class: "lineno", text: k + 1 }), d.visa.lines[k]);
          if (k >= first) {
            const i = k - first;
            e.dataset.instr = i;
            e.addEventListener("click", () => select([i], {}));
            instrLines[i] = e;
          }
          pane.append(e);
        }
        if (shown < d.visa.lines.length) pane.append(el("div", { class: "hint", text: `… ${d.visa.lines.length - shown} more lines in the dump` }));
        panes.append(pane);
      }
    }
    const opColour = (n) => (n.line ? "#dbe9f6" : "#eee");
    if (d.graph) {
      section.append(el("h3", { text: "Traced graph" }));
      const host = el("div", { class: "graph traced" });
      section.append(host);
      const nodes = drawGraph(host, d.graph, opColour, (n) => {
        const instrs = [];
        if (s) for (let i = 0; i < s.node.length; i++) if (s.node[i] === n.id) instrs.push(i);
        select(instrs, { nodes: [n.id], scroll: true });
      });
      graphNodes.traced = {};
      if (nodes) d.graph.nodes.forEach((n, i) => (graphNodes.traced[n.id] = nodes[i]));
    }
    if (d.lir_graph && s) {
      section.append(el("h3", { text: "LIR dependency graph" }));
      const host = el("div", { class: "graph lir" });
      section.append(host);
      const colourOf = (n) => s.colours[s.kinds.indexOf(n.group)] || "#999";
      const nodes = drawGraph(host, d.lir_graph, colourOf, (n) => select([n.id], { scroll: true }));
      graphNodes.lir = {};
      if (nodes) d.lir_graph.nodes.forEach((n, i) => (graphNodes.lir[n.id] = nodes[i]));
    }
    if (d.dumps && d.dumps.length) {
      const p = el("p", { class: "dumps" });
      p.append("Files: ");
      for (const f of d.dumps) p.append(el("a", { href: f, text: f.split("/").pop() }));
      section.append(el("h3", { text: "Artifacts and dumps" }), p);
    }
  }

  // -- index ---------------------------------------------------------------------------
  function sortable(table) {
    const ths = [...table.querySelectorAll("th")];
    ths.forEach((th, col) => th.addEventListener("click", () => {
      const asc = !th.classList.contains("sorted-asc");
      ths.forEach((h) => h.classList.remove("sorted-asc", "sorted-desc"));
      th.classList.add(asc ? "sorted-asc" : "sorted-desc");
      const body = table.tBodies[0];
      const rows = [...body.rows];
      const key = (r) => { const v = r.cells[col].dataset.sort ?? r.cells[col].textContent; const n = parseFloat(v); return isNaN(n) ? v : n; };
      rows.sort((a, b) => { const x = key(a), y = key(b); const c = typeof x === typeof y ? (x < y ? -1 : x > y ? 1 : 0) : typeof x === "number" ? -1 : 1; return asc ? c : -c; });
      for (const r of rows) body.append(r);
    }));
  }

  function renderBuild(index) {
    const host = document.getElementById("build");
    if (index.tasks && index.tasks.nodes && index.tasks.nodes.length) {
      host.append(el("h3", { text: "Task graph" }), el("p", { class: "hint", text: "red: `kiln status` would rerun it (hover for why)" }));
      const g = el("div", { class: "graph tasks" });
      host.append(g);
      drawGraph(g, index.tasks, (n) => (n.group === "rerun" ? "#ffd6cc" : "#e8f0e8"), null, true);
    }
    const prof = index.profile || [];
    if (prof.length) {
      host.append(el("h3", { text: "Last build's timeline (ms)" }));
      const lanes = [...new Set(prof.map((r) => r.worker))].sort((a, b) => a - b);
      const outcomes = ["ran", "up-to-date", "failed"];
      const data = {
        lanes: lanes.map((w) => "worker " + w),
        lane: prof.map((r) => lanes.indexOf(r.worker)),
        start: prof.map((r) => r.start_ms),
        end: prof.map((r) => r.end_ms),
        colour: prof.map((r) => Math.max(0, outcomes.indexOf(r.outcome))),
        colours: ["#4e79a7", "#bab0ac", "#b00020"],
        critical: index.profile_critical || [],
      };
      const t = el("div", { class: "timeline" });
      host.append(t);
      K.timelines["(build)"] = new Timeline(t, data, (i) => `${prof[i].task}\n${prof[i].outcome} · ${(prof[i].end_ms - prof[i].start_ms).toFixed(1)} ms`);
    }
  }

  async function main() {
    const index = JSON.parse(document.getElementById("kiln-index").textContent);
    sortable(document.getElementById("index-table"));
    renderBuild(index);
    for (const blob of document.querySelectorAll("script.kiln-detail")) {
      const section = document.getElementById(blob.dataset.section);
      renderInstance(section, await inflate(blob.textContent.trim()));
    }
    K.renderMs = performance.now();  // since navigation start: benchmarks/view.py reads it
    K.ready = true;
    document.body.dataset.ready = "1";
  }
  main().catch((e) => { console.error(e); document.body.dataset.ready = "error"; });
})();
