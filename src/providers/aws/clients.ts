/**
 * The SDK clients of one region, built from the configuration: each service
 * at its own endpoint (`endpoints.ec2` / `endpoints.ssm`, else `endpoint`,
 * else the SDK's default), every HTTP attempt bounded by `requestTimeoutMs`
 * (and its connection by `connectTimeoutMs`; the SDK's own default for both
 * is no limit), `maxAttempts` attempts per call in the SDK's standard retry
 * mode. So a call the endpoint never answers ends, and the operation's step
 * budget plus one call stays within the executor's lease (config.ts checks
 * the sum). Credentials come from the SDK's default chain unless an
 * emulator's are given.
 */
import { EC2Client, type EC2ClientConfig } from "@aws-sdk/client-ec2";
import { SSMClient } from "@aws-sdk/client-ssm";
import { sdkSettings, type AwsConfig } from "./config.js";

export interface AwsClients {
  ec2: EC2Client;
  ssm: SSMClient;
}

export function sdkClients(config: AwsConfig, region: string, credentials?: EC2ClientConfig["credentials"]): AwsClients {
  const s = sdkSettings(config);
  const base = {
    region,
    credentials,
    maxAttempts: s.maxAttempts,
    retryMode: "standard",
    // throwOnRequestTimeout: without it the SDK only logs a warning when requestTimeout passes and keeps waiting.
    requestHandler: { requestTimeout: s.requestTimeoutMs, connectionTimeout: s.connectTimeoutMs, throwOnRequestTimeout: true },
  };
  return {
    ec2: new EC2Client({ ...base, endpoint: config.endpoints?.ec2 ?? config.endpoint }),
    ssm: new SSMClient({ ...base, endpoint: config.endpoints?.ssm ?? config.endpoint }),
  };
}
