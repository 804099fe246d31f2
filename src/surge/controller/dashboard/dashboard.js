// The surge dashboard: polls /api/timeline every second and redraws tables and SVG charts.
// No dependencies and no network beyond this server: everything is drawn here.
"use strict";

const POLL_MS = 1000;
const state = { samples: [], decisions: [], since: null, historyS: 600 };

const COLORS = {
  offered: "#57606a", served: "#1a7f37", rejected: "#cf222e", errors: "#bc4c00",
  p50: "#0969da", p99: "#bf8700", running: "#1a7f37", target: "#1d2430",
  starting: "#bf8700", standby: "#8c959f", output: "#1a7f37", input: "#57606a",
  waiting: "#cf222e", kv: "#8250df", cpu: "#cf222e",
};

function esc(value) {
  return String(value).replace(/[&<>"']/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

function fmt(value, digits) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  const abs = Math.abs(value);
  if (digits === undefined) digits = abs >= 100 ? 0 : abs >= 10 ? 1 : 2;
  return Number(value).toLocaleString("en-US", {
    minimumFractionDigits: digits, maximumFractionDigits: digits });
}

function clock(t) {
  const d = new Date(t * 1000);
  return d.toTimeString().slice(0, 8);
}

function windowS() {
  return Number(document.getElementById("window").value) || 300;
}

function merge(data) {
  state.historyS = data.history_s || state.historyS;
  for (const sample of data.samples) state.samples.push(sample);
  for (const decision of data.decisions) state.decisions.push(decision);
  if (state.samples.length) state.since = state.samples[state.samples.length - 1].t;
  const oldest = data.now - state.historyS;
  state.samples = state.samples.filter((s) => s.t >= oldest);
  state.decisions = state.decisions.filter((d) => d.t >= oldest);
}

// -- tables ---------------------------------------------------------------------------------

function latestOf(key) {
  for (let i = state.samples.length - 1; i >= 0; i--) {
    const point = state.samples[i].deployments[key];
    if (point) return point;
  }
  return null;
}

function renderDeployments(status) {
  const rows = [];
  for (const [app, info] of Object.entries(status.applications)) {
    const deployments = Object.entries(info.deployments);
    deployments.forEach(([name, dep], index) => {
      const key = `${app}#${name}`;
      const p = latestOf(key) || {};
      const states = Object.entries(dep.replica_states).sort()
        .map(([s, n]) => `<span class="status-${esc(s)}">${esc(s)}</span>=${n}`).join(" ");
      const running = dep.replica_states.RUNNING || 0;
      rows.push(`<tr data-deployment="${esc(key)}">` +
        (index === 0 ? `<td rowspan="${deployments.length}" class="app">${esc(app)}</td>` +
          `<td rowspan="${deployments.length}" class="status-${esc(info.status)}">` +
          `${esc(info.status)}</td><td rowspan="${deployments.length}">` +
          `${esc(info.route_prefix === null ? "(handle only)" : info.route_prefix)}</td>` : "") +
        `<td class="deployment-name">${esc(name)}${dep.autoscaling ? " ⇅" : ""}</td>` +
        `<td class="status-${esc(dep.status)}">${esc(dep.status)}` +
        (dep.node_saturated ? ` <b class="node-saturated" title="${esc(dep.message)}">` +
          "node CPU saturated</b>" : "") + "</td>" +
        `<td class="num replicas">${running} / ${dep.target}</td><td>${states}</td>` +
        `<td class="num offered">${fmt(p.offered)}</td>` +
        `<td class="num served">${fmt(p.served)}</td>` +
        `<td class="num rejected">${fmt(p.rejected)}</td>` +
        `<td class="num">${fmt(p.queued, 0)}</td>` +
        `<td class="num">${fmt(p.p50_ms)}</td><td class="num">${fmt(p.p99_ms)}</td></tr>`);
    });
  }
  document.querySelector("#deployments tbody").innerHTML = rows.join("") ||
    '<tr><td colspan="13" class="muted">no applications yet</td></tr>';
}

function renderReplicas(status) {
  const rows = status.replicas
    .slice().sort((a, b) => (a.application + a.replica_id).localeCompare(b.application + b.replica_id))
    .map((r) => `<tr data-replica="${esc(r.replica_id)}"><td>${esc(r.replica_id)}</td>` +
      `<td>${esc(r.application)}</td><td>${esc(r.deployment)}</td>` +
      `<td class="status-${esc(r.state)}">${esc(r.state)}</td><td class="num">${r.pid}</td>` +
      `<td class="num">${r.version}</td><td>${esc((r.models || []).join(", "))}</td>` +
      `<td>${r.health_failures ? esc(r.health_failures + " failed check(s)") : "ok"}</td></tr>`);
  document.querySelector("#replicas tbody").innerHTML = rows.join("") ||
    '<tr><td colspan="8" class="muted">no replicas</td></tr>';
}

function renderDecisions(since) {
  const rows = state.decisions.filter((d) => d.t >= since).slice().reverse()
    .map((d) => `<tr class="decision-row" data-deployment="${esc(d.deployment)}">` +
      `<td>${clock(d.t)}</td><td>${esc(d.deployment)}</td>` +
      `<td>${d.from} → ${d.to}</td><td class="reason">${esc(d.reason)}</td></tr>`);
  document.querySelector("#decisions tbody").innerHTML = rows.join("") ||
    '<tr><td colspan="4" class="muted">none in this window</td></tr>';
}

// -- charts ---------------------------------------------------------------------------------

function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = Math.pow(10, Math.floor(Math.log10(value)));
  for (const step of [1, 2, 2.5, 5, 10]) if (step * power >= value) return step * power;
  return 10 * power;
}

// series: [{name, color, points: [[t, v|null]], step, dash}]
function chart(title, unit, series, t0, t1, decisions) {
  const W = 420, H = 180, L = 44, R = 8, T = 10, B = 20;
  const x = (t) => L + (W - L - R) * (t - t0) / Math.max(1e-9, t1 - t0);
  let top = 0;
  for (const s of series) for (const [, v] of s.points) if (v !== null && v > top) top = v;
  top = niceMax(top);
  const y = (v) => T + (H - T - B) * (1 - v / top);
  const parts = [`<svg viewBox="0 0 ${W} ${H}" role="img" aria-label="${esc(title)}">`];
  for (const f of [0, 0.5, 1]) {
    parts.push(`<line class="axis" x1="${L}" x2="${W - R}" y1="${y(top * f)}" y2="${y(top * f)}"/>`,
      `<text x="${L - 4}" y="${y(top * f) + 3}" text-anchor="end">${fmt(top * f)}</text>`);
  }
  for (const f of [0, 0.5, 1]) {
    const t = t0 + (t1 - t0) * f;
    parts.push(`<text x="${x(t)}" y="${H - 6}" text-anchor="${f === 0 ? "start" : f === 1 ? "end" : "middle"}">${clock(t)}</text>`);
  }
  for (const d of decisions) {
    if (d.t < t0 || d.t > t1) continue;
    const mark = d.to > d.from ? "▲" : d.to < d.from ? "▼" : "■";  // ■: held (saturated)
    parts.push(`<g class="decision" data-to="${d.to}" data-from="${d.from}">` +
      `<title>${esc(clock(d.t) + " " + d.from + " → " + d.to + ": " + d.reason)}</title>` +
      `<line x1="${x(d.t)}" x2="${x(d.t)}" y1="${T}" y2="${H - B}"/>` +
      `<text x="${x(d.t) + 2}" y="${T + 9}">${mark}${d.to}</text></g>`);
  }
  for (const s of series) {
    let path = "", pen = false, lastY = null;
    for (const [t, v] of s.points) {
      if (v === null || v === undefined) { pen = false; continue; }
      const px = x(t).toFixed(1), py = y(v).toFixed(1);
      if (!pen) path += `M${px},${py}`;
      else path += s.step ? `H${px}V${py}` : `L${px},${py}`;
      pen = true; lastY = py;
    }
    if (path) {
      parts.push(`<path class="series series-${esc(s.name)}" d="${path}" fill="none" ` +
        `stroke="${s.color}" stroke-width="1.6"${s.dash ? ' stroke-dasharray="4 3"' : ""}/>`);
    }
    void lastY;
  }
  parts.push("</svg>");
  const legend = series.map((s) =>
    `<span><i style="background:${s.color}"></i>${esc(s.name)}</span>`).join("");
  return `<div class="chart"><h3>${esc(title)} <span class="muted">${esc(unit)}</span></h3>` +
    `<div class="legend">${legend}</div>${parts.join("")}</div>`;
}

function renderCharts(status, now) {
  const t1 = now, t0 = now - windowS();
  const samples = state.samples.filter((s) => s.t >= t0);
  const blocks = [];
  const cpu = samples.map((s) => [s.t, s.node_cpu_pct ?? null]);
  for (const [app, info] of Object.entries(status.applications)) {
    for (const [name, dep] of Object.entries(info.deployments)) {
      const key = `${app}#${name}`;
      const pts = (field) => samples.map((s) => {
        const p = s.deployments[key];
        return [s.t, p ? p[field] : null];
      });
      const saturated = dep.node_saturated
        ? `<p class="node-saturated">Node CPU saturated: replicas added did not raise ` +
          `throughput, so none are added on this node (${esc(dep.node_saturated)})</p>` : "";
      const decisions = state.decisions.filter((d) => d.deployment === key);
      const p = latestOf(key) || {};
      blocks.push(`<div class="deployment" data-deployment="${esc(key)}">` +
        `<h3>${esc(key)}</h3><div class="summary">` +
        `offered <b class="offered-rate">${fmt(p.offered)} req/s</b> · ` +
        `served <b class="served-rate">${fmt(p.served)} req/s</b> · ` +
        `rejected <b class="rejected-rate">${fmt(p.rejected)} req/s</b> · ` +
        `p50 <b>${fmt(p.p50_ms)} ms</b> · p99 <b>${fmt(p.p99_ms)} ms</b> · ` +
        `replicas <b class="running-replicas">${p.running ?? "–"}</b> running, ` +
        `target <b class="target-replicas">${p.target ?? "–"}</b> · ` +
        `node CPU <b class="node-cpu">${fmt(dep.node_cpu_pct, 0)} %</b> · ` +
        `<span class="decision-count">${decisions.length}</span> scaling decision(s)` +
        `</div>${saturated}<div class="charts">` +
        chart("Requests", "per second", [
          { name: "offered", color: COLORS.offered, points: pts("offered") },
          { name: "served", color: COLORS.served, points: pts("served") },
          { name: "rejected", color: COLORS.rejected, points: pts("rejected") },
          { name: "5xx", color: COLORS.errors, points: pts("errors") },
        ], t0, t1, decisions) +
        chart("Latency", "ms", [
          { name: "p50", color: COLORS.p50, points: pts("p50_ms") },
          { name: "p99", color: COLORS.p99, points: pts("p99_ms") },
        ], t0, t1, decisions) +
        chart("Replicas", "count", [
          { name: "running", color: COLORS.running, points: pts("running"), step: true },
          { name: "target", color: COLORS.target, points: pts("target"), step: true, dash: true },
          { name: "starting", color: COLORS.starting, points: pts("starting"), step: true },
          { name: "standby", color: COLORS.standby, points: pts("standby"), step: true },
        ], t0, t1, decisions) +
        chart("Node CPU", "% of all cores busy", [
          { name: "busy", color: COLORS.cpu, points: dep.node_cpu_pct === null ? [] : cpu },
        ], t0, t1, decisions) +
        "</div></div>");
    }
  }
  document.getElementById("charts").innerHTML = blocks.length
    ? "<h2>Last " + (windowS() / 60) + " min</h2>" + blocks.join("") : "";
}

// -- LLM engines (points' "llm": deployments that record the LLM server's metrics) --------

function llmKeys(samples) {
  const keys = new Set();
  for (const s of samples) for (const key of Object.keys(s.llm || {})) keys.add(key);
  return [...keys].sort();
}

function latestLLM(key) {
  for (let i = state.samples.length - 1; i >= 0; i--) {
    const point = (state.samples[i].llm || {})[key];
    if (point) return point;
  }
  return null;
}

function llmBlock(key, samples, t0, t1) {
  const pts = (field) => samples.map((s) => {
    const p = (s.llm || {})[key];
    return [s.t, p ? p[field] : null];
  });
  const pair = (prefix) => [
    { name: "p50", color: COLORS.p50, points: pts(`${prefix}_p50_ms`) },
    { name: "p99", color: COLORS.p99, points: pts(`${prefix}_p99_ms`) }];
  const decisions = state.decisions.filter((d) => d.deployment === key);
  const p = latestLLM(key) || {};
  return `<div class="deployment llm" data-llm="${esc(key)}"><h3>${esc(key)}</h3>` +
    `<div class="summary">TTFT p50 <b class="ttft-p50">${fmt(p.ttft_p50_ms)} ms</b>, ` +
    `p99 <b class="ttft-p99">${fmt(p.ttft_p99_ms)} ms</b> · ` +
    `ITL p50 <b class="itl-p50">${fmt(p.itl_p50_ms)} ms</b>, ` +
    `p99 <b class="itl-p99">${fmt(p.itl_p99_ms)} ms</b> · ` +
    `output <b class="output-rate">${fmt(p.output_tokens_s)} tokens/s</b> · ` +
    `input <b class="input-rate">${fmt(p.input_tokens_s)} tokens/s</b> · ` +
    `running <b class="engine-running">${fmt(p.running, 0)}</b>, ` +
    `waiting <b class="engine-waiting">${fmt(p.waiting, 0)}</b> · ` +
    `KV cache <b class="kv-cache">${fmt(p.kv_cache_pct)} %</b> · ` +
    `replica overhead p50 <b class="overhead-p50">${fmt(p.overhead_p50_ms)} ms</b>` +
    `</div><div class="charts">` +
    chart("Time to first token", "ms", pair("ttft"), t0, t1, decisions) +
    chart("Inter-token latency", "ms", pair("itl"), t0, t1, decisions) +
    chart("Tokens", "per second", [
      { name: "output", color: COLORS.output, points: pts("output_tokens_s") },
      { name: "input", color: COLORS.input, points: pts("input_tokens_s") },
    ], t0, t1, decisions) +
    chart("Engine", "sequences", [
      { name: "running", color: COLORS.running, points: pts("running"), step: true },
      { name: "waiting", color: COLORS.waiting, points: pts("waiting"), step: true },
    ], t0, t1, decisions) +
    chart("KV cache", "% used", [
      { name: "used", color: COLORS.kv, points: pts("kv_cache_pct") },
    ], t0, t1, decisions) +
    chart("Replica overhead", "ms before the engine has the request", pair("overhead"),
      t0, t1, decisions) +
    "</div></div>";
}

function renderLLM(now) {
  const t1 = now, t0 = now - windowS();
  const samples = state.samples.filter((s) => s.t >= t0);
  const keys = llmKeys(samples);
  const section = document.getElementById("llm");
  section.hidden = keys.length === 0;
  section.innerHTML = keys.length ? "<h2>LLM engines, last " + (windowS() / 60) + " min</h2>" +
    keys.map((key) => llmBlock(key, samples, t0, t1)).join("") : "";
}

// -- loop -----------------------------------------------------------------------------------

let last = null;

function render() {
  if (!last) return;
  const status = last.status;
  document.getElementById("addresses").textContent =
    `control ${status.control_address} · http ${status.http_address || "–"}`;
  renderDeployments(status);
  renderCharts(status, last.now);
  renderLLM(last.now);
  renderDecisions(last.now - windowS());
  renderReplicas(status);
}

async function poll() {
  try {
    const query = state.since === null ? "" : `?since=${state.since}`;
    const response = await fetch(`/api/timeline${query}`, { cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const data = await response.json();
    merge(data);
    last = data;
    render();
    document.getElementById("updated").textContent = `updated ${clock(data.now)}`;
    document.getElementById("error").hidden = true;
  } catch (err) {
    const box = document.getElementById("error");
    box.textContent = `cannot reach the controller: ${err.message}; retrying`;
    box.hidden = false;
  }
  setTimeout(poll, POLL_MS);
}

const wanted = new URLSearchParams(window.location.search).get("window");
if (wanted) document.getElementById("window").value = wanted;
document.getElementById("window").addEventListener("change", render);
poll();
