// The console's entry point: which page to show. A page is chosen by the query string
// (`console` lists threads, `console?thread=<id>` shows one), so every view has a plain URL that
// can be bookmarked, reloaded or opened in a new tab, and the back button just works.

import { initKeyControls } from "./api.js";
import { showThread } from "./thread.js";
import { showThreads } from "./threads.js";

initKeyControls();
const main = document.getElementById("main");
const thread = new URLSearchParams(location.search).get("thread");
if (thread) showThread(main, thread);
else showThreads(main);
