/**
 * The berth client library: the package's entry point (`import { BerthClient } from "berth"`).
 * The CLI's client commands are built on it. See docs/client.md.
 */
export { BerthClient, type ClientOptions, type BorrowOptions, type ExecOptions, type ExecOutput, type ReturnOutcome, type RunOptions, type RunResult } from "./client.js";
export { MachineFiles, type FileEntry, type TransferOptions } from "./files.js";
export { Borrow, type Access } from "./borrow.js";
export { SshConnection, exitStatusOf, shellQuote, type ExecResult, type RemoteCommand, type SessionRequest, type SshTarget } from "./ssh.js";
export { Api, ApiError } from "./http.js";
export { ConfigError, loadConfig, type ClientConfig, type ConfigFlags } from "./config.js";
export type { Receipt, SshEndpoint } from "./receipt.js";
export { BerthError, type ErrorCode } from "../core/errors.js";
