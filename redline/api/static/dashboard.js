// The live dashboard: polls /v1/admin/stats and draws tiles, a per-tier table,
// a p99 chart from this page's own history, and the long-tail list.
import { authHeaders } from "/static/sse.js";

const WINDOW_S = 60;
const POLL_MS = 1000;
const HISTORY = 300;  // points kept for the chart (5 min at 1 s)
const COLORS = { S: "#ff4d4f", A: "#58a6ff", B: "#3fb950" };
const history = [];  // [{at, S: p99, A: p99, B: p99}]

const $ = (id) => document.getElementById(id);
const ms = (v) => (v === null || v === undefined ? "–" : v < 1000 ? `${v.toFixed(0)} ms` : `${(v / 1000).toFixed(2)} s`);
const pct = (v) => (v === null || v === undefined ? "–" : `${(100 * v).toFixed(1)}%`);

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  row.append(td);
}

// the semantic cache's error budget: estimated wrong-hit rate, its 95% upper bound, the budget
function budgetTiles(b) {
  if (!b) return [];
  return [
    ["wrong semantic hits (≤ 95% bound) / budget",
     b.judge_informative === false
       ? `judge cannot tell on these answers (${b.wrong} of ${b.verified} called wrong) / ${pct(b.budget)}`
       : `${pct(b.rate)} (≤ ${pct(b.upper)}) / ${pct(b.budget)} · ${b.wrong} of ${b.verified}`],
    ["semantic threshold", b.semantic_on ? b.threshold.toFixed(2) : "off"],
  ];
}

// the semantic lookup: on, or skipped while it would not pay (cache.semantic_skip)
function lookupTiles(l) {
  if (!l) return [];
  const why = l.lookup_ms === null || l.answer_ms === null ? "" :
    ` · would serve ≤ ${pct(l.share_upper)} of ${l.seen}; lookup ${l.lookup_ms} ms, answer ${l.answer_ms} ms`;
  return [["semantic lookup", (l.looking_up ? "on" : `skipped (${l.skipped})`) + why]];
}

function tiles(stats) {
  const live = stats.live || {};
  const items = [
    ["requests/s", live.requests_per_s?.toFixed(2) ?? "–"],
    ["tokens/s", live.tokens_per_s?.toFixed(1) ?? "–"],
    ["in flight", stats.in_flight],
    ["cache hit rate", pct(live.cache_hit_rate)],
    ...budgetTiles(stats.cache_budget),
    ...lookupTiles(stats.cache_lookup),
    ["interrupted (window)", live.interrupted ?? "–"],
    ["interruptions / resumes", `${stats.interruptions_total} / ${stats.resumes_total}`],
    ["CPU", pct(stats.hardware.cpu_utilization)],
    ["memory", pct(stats.hardware.memory_utilization)],
  ];
  for (const gpu of stats.hardware.gpus) items.push([`GPU ${gpu.index} (${gpu.name})`, pct(gpu.utilization)]);
  const box = $("tiles");
  box.textContent = "";
  for (const [k, v] of items) {
    const tile = document.createElement("div");
    tile.className = "tile";
    tile.innerHTML = '<div class="v"></div><div class="k"></div>';
    tile.firstChild.textContent = v;
    tile.lastChild.textContent = k;
    box.append(tile);
  }
}

function tierTable(stats) {
  const body = $("tiers").tBodies[0];
  body.textContent = "";
  const tiers = stats.live?.tiers || {};
  for (const tier of ["S", "A", "B"]) {
    const t = tiers[tier];
    const row = body.insertRow();
    row.dataset.tier = tier;
    cell(row, tier);
    cell(row, t ? t.requests : 0);
    const over = (v, budget) => (v !== null && budget !== null && v > budget ? "bad" : v !== null ? "ok" : "");
    cell(row, ms(t?.ttft_ms.p50));
    cell(row, ms(t?.ttft_ms.p99), t ? over(t.ttft_ms.p99, t.budget_ms.ttft) : "");
    cell(row, t?.budget_ms.ttft ? `< ${ms(t.budget_ms.ttft)}` : "–");
    cell(row, ms(t?.e2e_ms.p50));
    cell(row, ms(t?.e2e_ms.p99), t ? over(t.e2e_ms.p99, t.budget_ms.total) : "");
    cell(row, t?.budget_ms.total ? `< ${ms(t.budget_ms.total)}` : "–");
    cell(row, pct(t?.slo_attainment));
    cell(row, stats.slo_violations_total[tier] ?? 0);
  }
}

function slowTable(stats) {
  const body = $("slow").tBodies[0];
  body.textContent = "";
  for (const r of stats.slow) {
    const row = body.insertRow();
    cell(row, new Date(r.at * 1000).toLocaleTimeString());
    cell(row, r.id);
    cell(row, r.tier);
    cell(row, r.model);
    cell(row, r.cache);
    cell(row, r.status);
    cell(row, r.over.join(" + "), "bad");
    cell(row, ms(r.ttft_ms));
    cell(row, ms(r.total_ms));
    cell(row, Object.entries(r.timings_ms).filter(([k]) => k !== "total")
      .map(([k, v]) => `${k} ${v.toFixed(0)}`).join(" · "));
    cell(row, `${r.prompt_tokens ?? "?"} / ${r.completion_tokens ?? "?"}`);
  }
}

function chart() {
  const canvas = $("chart");
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 30;
  ctx.clearRect(0, 0, w, h);
  const values = history.flatMap((p) => ["S", "A", "B"].map((t) => p[t]).filter((v) => v != null));
  const top = Math.max(1000, ...values) * 1.1;
  ctx.strokeStyle = "#262b36";
  ctx.fillStyle = "#8a93a6";
  ctx.font = "11px system-ui";
  for (const line of [1000, 3000].filter((v) => v < top)) {  // tier S and A first-token budgets
    const y = h - pad - ((h - 2 * pad) * line) / top;
    ctx.beginPath(); ctx.moveTo(pad, y); ctx.lineTo(w - 5, y); ctx.stroke();
    ctx.fillText(`${line / 1000} s`, 2, y + 4);
  }
  for (const tier of ["S", "A", "B"]) {
    ctx.strokeStyle = COLORS[tier];
    ctx.beginPath();
    let started = false;
    history.forEach((p, i) => {
      if (p[tier] == null) return;
      const x = pad + ((w - pad - 5) * i) / (HISTORY - 1);
      const y = h - pad - ((h - 2 * pad) * p[tier]) / top;
      if (started) ctx.lineTo(x, y); else { ctx.moveTo(x, y); started = true; }
    });
    ctx.stroke();
    ctx.fillStyle = COLORS[tier];
    ctx.fillText(`tier ${tier}`, w - 60, 14 + 14 * ["S", "A", "B"].indexOf(tier));
  }
}

async function poll() {
  try {
    const response = await fetch(`/v1/admin/stats?window_s=${WINDOW_S}`, { headers: authHeaders() });
    if (!response.ok) throw new Error(`${response.status}`);
    const stats = await response.json();
    window.redlineStats = stats;
    tiles(stats);
    tierTable(stats);
    slowTable(stats);
    const point = { at: stats.at };
    for (const [tier, t] of Object.entries(stats.live?.tiers || {})) point[tier] = t.ttft_ms.p99;
    history.push(point);
    if (history.length > HISTORY) history.shift();
    chart();
    $("status").textContent = stats.metrics_enabled
      ? `live · updated ${new Date().toLocaleTimeString()}` : "metrics are off (telemetry.metrics: false)";
  } catch (err) {
    $("status").textContent = `no data (${err.message}); retrying…`;
  }
}

$("window").textContent = WINDOW_S;
poll();
setInterval(poll, POLL_MS);
