/** Where the CLI finds its coordinator and credentials: the client library's rules (src/client/config.ts). */
export { configCandidates, loadConfig, type ClientConfig, type ConfigFlags } from "../client/config.js";
