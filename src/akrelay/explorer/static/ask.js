// akrelay explorer, Ask page: stream a KnowQL answer over SSE (POST /query, stream: true).
// Without this script the form posts to /explorer/ask and the page shows the synchronous answer.
"use strict";
(function () {
  const form = document.getElementById("ask-form");
  if (!form || !window.fetch || !window.TextDecoder) return;
  const lead = document.getElementById("lead-answer");
  const answer = document.getElementById("answer");
  let full = "";

  // The first line of the answer is its lead (the fact, cited, with its belief): shown above the evidence.
  function show(text) {
    full = text;
    const cut = text.indexOf("\n");
    lead.textContent = cut < 0 ? text : text.slice(0, cut);
    answer.textContent = cut < 0 ? "" : text.slice(cut + 1).replace(/^\n+/, "");
  }
  const citations = document.getElementById("citations");
  const status = document.getElementById("ask-status");

  function citationItem(n, c) {
    const li = document.createElement("li");
    li.value = n;
    const a = document.createElement("a");
    a.className = "citation";
    a.href = "/explorer/capsules/" + encodeURIComponent(String(c.source || ""));
    a.textContent = c.title || c.source || "";
    const belief = document.createElement("span");
    belief.className = "status status-" + String(c.belief || "").replace(/[^a-z_]/g, "");
    belief.textContent = c.belief || "";
    li.append(a, " ", belief);
    return li;
  }

  function handle(event, data) {
    if (event === "response.output_text.delta") {
      show(full + (data.delta || ""));
    } else if (event === "response.step") {
      status.textContent = (data.step_id || data.step || "step") + ": " + (data.status || "");
    } else if (event === "query") {
      status.textContent = data.status || "";
      const text = ((data.output || [])[0] || {}).content;
      if (text && text[0] && !full) show(text[0].text || "");
      if (data.error && !full) show(data.error);
      citations.replaceChildren();
      (data.citations || []).forEach(function (c, i) { citations.append(citationItem(i + 1, c)); });
      document.body.dataset.answered = "true";
    }
  }

  async function ask(question, policy) {
    show("");
    citations.replaceChildren();
    status.textContent = "asking…";
    delete document.body.dataset.answered;
    const body = { ask: question, scope: ["knowledge"], stream: true };
    if (policy) body.vars = { policy: policy };
    const response = await fetch("/query", {
      method: "POST", headers: { "Content-Type": "application/json", "Accept": "text/event-stream" },
      body: JSON.stringify(body),
    });
    if (!response.ok) {
      let message = response.status + "";
      try { message = (await response.json()).error.message; } catch (e) { /* keep the status */ }
      status.textContent = "error: " + message;
      return;
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const chunk = await reader.read();
      if (chunk.done) break;
      buffer += decoder.decode(chunk.value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        let event = "message", data = "";
        block.split("\n").forEach(function (line) {
          if (line.startsWith("event: ")) event = line.slice(7);
          else if (line.startsWith("data: ")) data += line.slice(6);
        });
        if (data) handle(event, JSON.parse(data));
      }
    }
  }

  form.addEventListener("submit", function (e) {
    e.preventDefault();
    const data = new FormData(form);
    ask(String(data.get("ask") || ""), String(data.get("policy") || "")).catch(function (err) {
      status.textContent = "error: " + err;
    });
  });
})();
