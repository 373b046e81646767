// vfray view: the little the pages need from a script. Follow a run being written (poll the
// run's change stamp, offer a reload) and fetch a call's token ids and logprobs on demand.
"use strict";

function followRun() {
  const url = document.body.dataset.live;
  if (!url) return;
  const seen = new URL(url, location.href).searchParams.get("seen");
  const banner = document.getElementById("live-banner");
  const poll = async () => {
    try {
      const reply = await fetch(url, { cache: "no-store" });
      const data = await reply.json();
      if (data.stamp && data.stamp !== seen) {
        banner.hidden = false;
        banner.querySelector("a").href = location.href;
        return;
      }
    } catch (e) { /* the server stopped: keep the page as it is */ }
    setTimeout(poll, 2000);
  };
  setTimeout(poll, 2000);
}

function cell(text) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  return td;
}

function tokenTable(data) {
  const box = document.createElement("div");
  for (const [name, ids] of [["prompt token ids", data.prompt_token_ids]]) {
    if (!ids) continue;
    const p = document.createElement("p");
    p.textContent = name + " (" + ids.length + "): " + ids.join(" ");
    box.appendChild(p);
  }
  const out = data.completion_token_ids || [];
  const lps = data.completion_logprobs || [];
  if (out.length || lps.length) {
    const table = document.createElement("table");
    table.className = "tokens";
    const head = document.createElement("tr");
    ["#", "completion token id", "logprob"].forEach((h) => { const th = document.createElement("th"); th.textContent = h; head.appendChild(th); });
    table.appendChild(head);
    for (let i = 0; i < Math.max(out.length, lps.length); i++) {
      const tr = document.createElement("tr");
      tr.append(cell(i), cell(out[i]), cell(lps[i] === undefined ? "" : Number(lps[i]).toFixed(4)));
      table.appendChild(tr);
    }
    box.appendChild(table);
  }
  return box;
}

function lazyTokens() {
  document.querySelectorAll("details.tokens[data-src]").forEach((details) => {
    details.addEventListener("toggle", async () => {
      if (!details.open || details.dataset.loaded) return;
      details.dataset.loaded = "1";
      const slot = details.querySelector(".slot");
      try {
        const reply = await fetch(details.dataset.src);
        slot.replaceChildren(tokenTable(await reply.json()));
      } catch (e) {
        slot.textContent = "could not load: " + e;
      }
    });
  });
}

document.addEventListener("DOMContentLoaded", () => { followRun(); lazyTokens(); });
