// Following a thread's observation stream, for as long as the page wants it, across network drops
// and server restarts, showing each observation exactly once.
//
// Why not EventSource: it cannot send an `Authorization` header, and the stream is behind the API
// keys. So this reads the SSE response with fetch and parses the frames itself, and does what
// EventSource would: on any end or error it reconnects with `Last-Event-ID` set to the last `seq`
// it delivered. The server then replays exactly what came after it, so nothing is missed; and a
// frame whose `seq` is not above the last one delivered is dropped, so nothing is shown twice.
//
// Token frames (`event: token`, asked for when the page wants them) are another kind: the model's
// text as it is written, with no `id:`, never stored and never replayed. They go to their own
// callback, untouched by the `seq` bookkeeping: they never move the `Last-Event-ID` of the next
// reconnect and are never dropped as "seen", since they have no place in the log.

import { apiUrl, askForKey, authHeaders, seg, storedKey } from "./api.js";

// The server sends a keep-alive comment every 15 s by default: no byte for this long means the
// connection is dead even if the socket has not noticed (a laptop that slept, a dropped route).
const STALL_MS = 45_000;
const RETRY_MIN_MS = 250;
const RETRY_MAX_MS = 5_000;

/**
 * Follow `threadId` from after `seq` `after`. `onObservation(obs)` gets each observation once, in
 * order; `onState(state, detail)` hears `"live"` (with the `seq` it resumed after),
 * `"reconnecting"` (with the error), `"deleted"` and `"gone"` (404). With `onToken`, the stream
 * also carries the model's text as it is written: `onToken({runId, itemId, phase, delta})` gets
 * each delta of this connection, between the observations, in the order the server sent them.
 * Returns `{close()}`.
 */
export function follow(threadId, { after = 0, onObservation, onState, onToken = null }) {
  const path = `v1/threads/${seg(threadId)}/events${onToken ? "?tokens=true" : ""}`;
  let last = after;
  let closed = false;
  let controller = null;
  // Whether the connection that just ended had been established: the next retry is then quick.
  let wasLive = false;

  async function connectOnce() {
    controller = new AbortController();
    let stall = setTimeout(() => controller.abort("stalled"), STALL_MS);
    const resetStall = () => {
      clearTimeout(stall);
      stall = setTimeout(() => controller.abort("stalled"), STALL_MS);
    };
    try {
      const response = await fetch(apiUrl(path), {
        headers: {
          Accept: "text/event-stream",
          "Last-Event-ID": String(last),
          ...authHeaders(),
        },
        signal: controller.signal,
        cache: "no-store",
      });
      if (response.status === 401) {
        clearTimeout(stall);
        await askForKey(storedKey() !== null);
        return "retry-now";
      }
      if (response.status === 404) return "gone";
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      wasLive = true;
      onState("live", last);
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        resetStall();
        buffer += decoder.decode(value, { stream: true });
        // Frames end with a blank line; the server writes `\n` line ends.
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const frame = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          if (deliver(frame) === "deleted") return "deleted";
        }
      }
      throw new Error("the stream ended");
    } finally {
      clearTimeout(stall);
    }
  }

  /** Parse one frame and hand its observation on, unless it was delivered already. */
  function deliver(frame) {
    let id = null;
    let event = null;
    const data = [];
    for (const line of frame.split("\n")) {
      if (line.startsWith(":")) continue; // keep-alive comment
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "id") id = value;
      else if (field === "event") event = value;
      else if (field === "data") data.push(value);
    }
    if (event === "THREAD_DELETED") return "deleted";
    if (event === "token") {
      // Ephemeral: whatever its lines say, it is not an observation and leaves `last` alone.
      if (onToken && data.length > 0) onToken(JSON.parse(data.join("\n")));
      return null;
    }
    if (id === null || data.length === 0) return null;
    const seq = Number(id);
    if (!Number.isSafeInteger(seq) || seq <= last) return null;
    const observation = JSON.parse(data.join("\n"));
    last = seq;
    onObservation(observation);
    return null;
  }

  (async () => {
    let delay = RETRY_MIN_MS;
    while (!closed) {
      let outcome;
      try {
        outcome = await connectOnce();
      } catch (error) {
        if (closed) return;
        if (wasLive) {
          wasLive = false;
          delay = RETRY_MIN_MS;
        }
        onState("reconnecting", error);
        await new Promise((r) => setTimeout(r, delay));
        delay = Math.min(delay * 2, RETRY_MAX_MS);
        continue;
      }
      if (outcome === "retry-now") continue;
      onState(outcome);
      return;
    }
  })();

  return {
    close() {
      closed = true;
      controller?.abort("closed");
    },
    /** The last `seq` delivered. */
    get last() {
      return last;
    },
  };
}
