// The chat playground: skeleton at once, progress bar and countdown from
// redline.progress, stage timings at the end, automatic resume after a dropped connection.
// Two modes: chat (the whole history through /v1/chat/completions) and Responses
// (/v1/responses: each turn continues the last by previous_response_id; the server
// keeps the conversation; a dropped stream resumes by starting_after).
import { authHeaders, parseServerTiming, readEvents, seqOf } from "/static/sse.js";

const $ = (id) => document.getElementById(id);
const STAGE_COLORS = { queue: "#8a93a6", cache: "#3fb950", route: "#a371f7", tokenize: "#d29922",
  prefill: "#ff4d4f", decode: "#58a6ff", detokenize: "#db61a2" };
const MAX_RESUME_TRIES = 8;

// what the page measured, per answer (read by tests and benchmarks)
window.redline = { runs: [] };
const history = [];
let previousResponseId = null;  // Responses mode: the last answer, which the next turn continues

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

// resolves just after the next paint
const afterPaint = () => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

class Answer {
  constructor(maxTokens) {
    this.maxTokens = maxTokens;
    this.node = el("div", "msg answer");
    this.meta = el("div", "meta");
    this.countdown = el("span", "countdown", "waiting for the first token…");
    this.progress = el("div", "progress indeterminate");
    this.bar = el("div", "bar");
    this.progress.append(this.bar);
    this.skeleton = el("div", "skeleton");
    this.skeleton.append(el("div"), el("div"), el("div"));
    this.text = el("div", "text");
    this.timings = el("div", "timings");
    this.meta.append(this.countdown);
    this.node.append(this.meta, this.progress, this.skeleton, this.text, this.timings);
    this.node.dataset.state = "waiting";
    this.deadline = null;
    this.widths = [];  // the progress bar's successive widths, %
    this.etas = [];  // the countdown's successive eta_ms
    this.ticker = setInterval(() => this.tick(), 100);
  }

  badge(label, cls) {
    const b = el("span", "badge" + (cls ? " " + cls : ""), label);
    this.meta.insertBefore(b, this.countdown);
    return b;
  }

  // redline.progress: {tokens, expected_tokens, eta_ms}
  setProgress(tokens, expected, etaMs) {
    if (expected > 0) {
      this.progress.classList.remove("indeterminate");
      this.bar.style.width = `${Math.min(100, (100 * tokens) / expected).toFixed(1)}%`;
      this.progress.dataset.tokens = tokens;
      this.progress.dataset.expected = expected;
      if (this.widths.length < 1000) this.widths.push(Math.min(100, (100 * tokens) / expected));
    }
    if (etaMs !== undefined && etaMs !== null) {
      this.deadline = performance.now() + etaMs;
      if (this.etas.length < 1000) this.etas.push(etaMs);
    }
  }

  tick() {
    if (this.deadline === null) return;
    const left = Math.max(0, this.deadline - performance.now());
    this.countdown.textContent = left > 0 ? `≈ ${(left / 1000).toFixed(1)} s left` : "almost done…";
  }

  stop(state) {
    clearInterval(this.ticker);
    this.node.dataset.state = state;
    this.skeleton.remove();
  }
}

async function send(prompt) {
  const t0 = performance.now();
  const run = { t0, skeletonMs: null, firstTokenMs: null, doneMs: null, tokens: 0, resumes: 0,
    progressEvents: 0, text: "", error: null, streamId: null, serverTiming: null, timings: null };
  window.redline.runs.push(run);
  const maxTokens = Number($("max-tokens").value) || 128;
  history.push({ role: "user", content: prompt });
  const log = $("log");
  log.append(el("div", "msg user", prompt));
  const answer = new Answer(maxTokens);
  run.widths = answer.widths;
  run.etas = answer.etas;
  log.append(answer.node);
  answer.node.scrollIntoView({ block: "end" });
  afterPaint().then(() => { run.skeletonMs = performance.now() - t0; });

  try {
    const answerWith = $("mode").value === "responses" ? respond : chat;
    await answerWith(prompt, answer, run, t0, maxTokens);
    run.doneMs = performance.now() - t0;
    finish(answer, run);
    history.push({ role: "assistant", content: run.text });
  } catch (err) {
    run.error = String(err.message || err);
    answer.stop("error");
    answer.text.append(el("div", "error", run.error));
    history.pop();
  }
}

// one chat completion, streamed; resumes through /v1/streams/{id} when the connection drops
async function chat(prompt, answer, run, t0, maxTokens) {
  const body = { model: $("model").value, messages: history.slice(), stream: true,
    max_tokens: maxTokens, stream_options: { include_usage: true } };
  if ($("tier").value !== "auto") body.tier = $("tier").value;
  if (!$("use-cache").checked) body.cache = false;

  let streamId = null;
  let lastId = null;
  let done = false;
  let tries = 0;
  let response = await fetch("/v1/chat/completions", {
    method: "POST", headers: { "Content-Type": "application/json", ...authHeaders() },
    body: JSON.stringify(body) });
  if (!response.ok) throw new Error(await errorText(response));
  streamId = response.headers.get("X-Redline-Stream-Id");
  run.streamId = streamId;
  showHeaders(answer, response, run);
  for (;;) {
    try {
      for await (const event of readEvents(response)) {
        const seq = seqOf(event.id);
        if (seq !== null && seqOf(lastId) !== null && seq <= seqOf(lastId)) continue;  // already shown
        if (event.id) lastId = event.id;
        tries = 0;
        if (event.data === "[DONE]") { done = true; break; }
        handle(JSON.parse(event.data), answer, run, t0);
      }
    } catch (err) {
      if (err instanceof ServerError) throw err;
      // a network error mid-stream: fall through to resume
    }
    if (done) break;
    // the stream ended without [DONE]: the connection dropped
    if (!streamId || tries >= MAX_RESUME_TRIES) throw new Error("the connection dropped");
    tries += 1;
    answer.node.dataset.state = "resuming";
    answer.countdown.textContent = "reconnecting…";
    await sleep(Math.min(2000, 100 * 2 ** (tries - 1)));
    try {
      response = await fetch(`/v1/streams/${encodeURIComponent(streamId)}`, {
        headers: { ...authHeaders(), ...(lastId ? { "Last-Event-ID": lastId } : {}) } });
    } catch (err) { continue; }  // still offline: try again
    if (!response.ok) throw new Error(await errorText(response));
    run.resumes += 1;
    answer.node.dataset.resumes = run.resumes;
    answer.node.dataset.state = "streaming";
  }
}

// Responses mode: one turn through POST /v1/responses (stream), chained to the last
// answer by previous_response_id; a dropped connection resumes by
// GET /v1/responses/{id}?stream=true&starting_after=<last sequence_number>.
async function respond(prompt, answer, run, t0, maxTokens) {
  const body = { model: $("model").value, input: prompt, stream: true,
    max_output_tokens: maxTokens };
  if (previousResponseId) body.previous_response_id = previousResponseId;
  run.previousResponseId = previousResponseId;
  if ($("tier").value !== "auto") body.tier = $("tier").value;
  if (!$("use-cache").checked) body.cache = false;
  let response = await fetch("/v1/responses", {
    method: "POST", headers: { "Content-Type": "application/json", ...authHeaders() },
    body: JSON.stringify(body) });
  if (!response.ok) throw new Error(await errorText(response));
  run.responseId = response.headers.get("X-Request-Id");
  showHeaders(answer, response, run);
  let last = -1;  // the last sequence_number shown
  let done = false;
  let tries = 0;
  for (;;) {
    try {
      for await (const event of readEvents(response)) {
        if (event.data === "[DONE]") { done = true; break; }
        const data = JSON.parse(event.data);
        if (data.sequence_number <= last) continue;  // already shown
        last = data.sequence_number;
        tries = 0;
        onResponseEvent(data, answer, run, t0);
      }
    } catch (err) {
      if (err instanceof ServerError) throw err;
    }
    if (done) break;
    if (!run.responseId || tries >= MAX_RESUME_TRIES) throw new Error("the connection dropped");
    tries += 1;
    answer.node.dataset.state = "resuming";
    answer.countdown.textContent = "reconnecting…";
    await sleep(Math.min(2000, 100 * 2 ** (tries - 1)));
    try {
      response = await fetch(`/v1/responses/${encodeURIComponent(run.responseId)}` +
        `?stream=true&starting_after=${last}`, { headers: authHeaders() });
    } catch (err) { continue; }
    if (!response.ok) throw new Error(await errorText(response));
    run.resumes += 1;
    answer.node.dataset.resumes = run.resumes;
    answer.node.dataset.state = "streaming";
  }
  previousResponseId = run.responseId;  // the next turn continues from this answer
}

function onResponseEvent(event, answer, run, t0) {
  const progress = event.redline?.progress;
  if (progress) {
    run.progressEvents += 1;
    answer.setProgress(progress.tokens, progress.expected_tokens, progress.eta_ms);
  }
  if (event.type === "response.created") run.responseId = event.response.id;
  else if (event.type === "response.output_text.delta") addText(event.delta, progress, answer, run, t0);
  else if (event.type === "response.failed" || event.type === "error") {
    const error = event.response?.error || event;
    throw new ServerError(error.message || `the response ${event.response?.status || "failed"}`);
  } else if (event.type === "response.completed" || event.type === "response.incomplete") {
    if (event.redline?.timings) run.timings = event.redline.timings;
    const usage = event.response.usage;
    if (usage) run.usage = { prompt_tokens: usage.input_tokens, completion_tokens: usage.output_tokens };
    run.status = event.response.status;
  }
}

class ServerError extends Error {}

async function errorText(response) {
  try {
    const body = await response.json();
    const retry = response.headers.get("Retry-After");
    return `${response.status}: ${body.error?.message || response.statusText}` +
      (retry ? ` (retry after ${retry} s)` : "");
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

function showHeaders(answer, response, run) {
  const cache = response.headers.get("X-Redline-Cache");
  for (const [name, label] of [["X-Redline-Tier", "tier "], ["X-Redline-Model", ""]]) {
    const v = response.headers.get(name);
    if (v) answer.badge(label + v);
  }
  if (cache) answer.badge(`cache ${cache}`, cache === "hit" || cache === "semantic" ? "hit" : "");
  run.serverTiming = parseServerTiming(response.headers.get("Server-Timing"));
}

function handle(chunk, answer, run, t0) {
  if (chunk.error) throw new ServerError(chunk.error.message || "generation failed");
  const progress = chunk.redline?.progress;
  if (progress) {
    run.progressEvents += 1;
    answer.setProgress(progress.tokens, progress.expected_tokens, progress.eta_ms);
  }
  if (chunk.redline?.timings) run.timings = chunk.redline.timings;
  const choice = chunk.choices?.[0];
  addText(choice?.delta?.content, progress, answer, run, t0);
  if (chunk.usage) run.usage = chunk.usage;
}

function addText(piece, progress, answer, run, t0) {
  if (piece) {
    if (run.firstTokenMs === null) {
      answer.skeleton.remove();
      answer.node.dataset.state = "streaming";
      if (answer.deadline === null) answer.countdown.textContent = "";
      afterPaint().then(() => { run.firstTokenMs = performance.now() - t0; });
    }
    run.text += piece;
    run.tokens += 1;
    answer.text.textContent = run.text;
    if (!progress) answer.setProgress(run.tokens, answer.maxTokens);  // no estimate: max_tokens
  }
}

function finish(answer, run) {
  answer.stop("done");
  answer.progress.classList.remove("indeterminate");
  answer.progress.classList.add("done");
  answer.bar.style.width = "100%";
  answer.countdown.textContent = `done in ${(run.doneMs / 1000).toFixed(2)} s`;
  if (run.resumes) answer.badge(`resumed ×${run.resumes}`, "warn");
  const stages = run.timings || run.serverTiming || {};
  const total = stages.total || run.doneMs;
  const bar = el("div", "stages");
  const legend = el("div", "legend");
  for (const [name, ms] of Object.entries(stages)) {
    if (name === "total" || !(ms > 0)) continue;
    const part = el("span");
    part.style.width = `${(100 * ms) / total}%`;
    part.style.background = STAGE_COLORS[name] || "#666";
    part.title = `${name} ${ms.toFixed(1)} ms`;
    bar.append(part);
    const item = el("span");
    const dot = el("i");
    dot.style.background = part.style.background;
    item.append(dot, `${name} ${ms.toFixed(1)} ms`);
    legend.append(item);
  }
  const tokens = run.usage?.completion_tokens ?? run.tokens;
  const decodeS = (run.doneMs - (run.firstTokenMs ?? 0)) / 1000;
  const summary = el("div", "", `first token ${fmt(run.firstTokenMs)} · total ${fmt(run.doneMs)}` +
    ` · ${tokens} tokens` + (decodeS > 0 && tokens > 1 ? ` · ${(tokens / decodeS).toFixed(0)} tok/s` : "") +
    (stages.total ? ` · server ${fmt(stages.total)}` : ""));
  answer.timings.append(summary, bar, legend);
}

const fmt = (ms) => (ms === null || ms === undefined ? "–" : ms < 1000 ? `${ms.toFixed(0)} ms` : `${(ms / 1000).toFixed(2)} s`);

async function loadModels() {
  try {
    const response = await fetch("/v1/models", { headers: authHeaders() });
    if (!response.ok) return;
    const { data } = await response.json();
    const select = $("model");
    select.textContent = "";
    for (const m of data) {
      if (m.capabilities && !m.capabilities.includes("chat")) continue; // embeddings, base models
      select.append(new Option(m.id, m.id, m.id === "auto", m.id === "auto"));
    }
  } catch { /* the server is still starting: keep `auto` */ }
}

function init() {
  const key = $("api-key");
  key.value = localStorage.getItem("redline.apiKey") || "";
  key.addEventListener("change", () => {
    if (key.value) localStorage.setItem("redline.apiKey", key.value);
    else localStorage.removeItem("redline.apiKey");
    loadModels();
  });
  loadModels();
  const form = $("composer");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const prompt = $("prompt").value.trim();
    if (!prompt) return;
    $("prompt").value = "";
    $("send").disabled = true;
    try { await send(prompt); } finally { $("send").disabled = false; $("prompt").focus(); }
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); form.requestSubmit(); }
  });
  $("clear").addEventListener("click", () => {
    history.length = 0;
    previousResponseId = null;
    $("log").textContent = "";
  });
}

init();
