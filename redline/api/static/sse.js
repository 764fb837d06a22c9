// Server-sent events over fetch + ReadableStream: yields {id, data} per event.
// (EventSource cannot POST, nor send Last-Event-ID on a fetch we control.)
export async function* readEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
        const event = parseBlock(block);
        if (event) yield event;
      }
    }
  } finally {
    reader.releaseLock();
  }
}

function parseBlock(block) {
  let id = null;
  const data = [];
  for (const line of block.split(/\r?\n/)) {
    if (!line || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "id") id = value;
    else if (field === "data") data.push(value);
  }
  return data.length ? { id, data: data.join("\n") } : null;
}

// "strm-abc:12" -> 12 (null when absent or malformed)
export function seqOf(id) {
  if (!id) return null;
  const n = Number(id.slice(id.lastIndexOf(":") + 1));
  return Number.isInteger(n) ? n : null;
}

// "prefill;dur=12.3, decode;dur=40" -> {prefill: 12.3, decode: 40}
export function parseServerTiming(header) {
  const out = {};
  for (const part of (header || "").split(",")) {
    const [name, ...params] = part.trim().split(";");
    const dur = params.map((p) => p.trim()).find((p) => p.startsWith("dur="));
    if (name && dur) out[name] = Number(dur.slice(4));
  }
  return out;
}

// The API key the playground saved (servers with auth.keys); shared with the dashboard.
export function authHeaders() {
  const key = localStorage.getItem("redline.apiKey");
  return key ? { Authorization: `Bearer ${key}` } : {};
}
