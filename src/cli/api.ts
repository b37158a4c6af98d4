/** The coordinator API client lives with the client library; the CLI, benchmarks and tests use it from here too. */
export { Api, ApiError } from "../client/http.js";
