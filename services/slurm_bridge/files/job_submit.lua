--[[
Kelvin: jobs submitted to Kelvin's partitions wait, held, until Kelvin's
allocator chooses their nodes (the Slurm bridge sets them and releases the job).

Install: JobSubmitPlugins=lua in slurm.conf, this file as job_submit.lua next
to slurm.conf (`kelvin slurm files --dir /etc/slurm` writes it with the values
below filled in), then `scontrol reconfigure`.

It never calls out (no HTTP, no Slurm command): a slow or dead Kelvin leaves
jobs held and never blocks slurmctld. Jobs are marked with AdminComment
"kelvin", which users cannot set or change.

Users cannot bypass placement: changes to a Kelvin job's hold, node list,
node count, partition or AdminComment are refused ("Access/permission
denied"; slurmctld logs "kelvin: refused ...") unless made by an operator
(root, SlurmUser, the bridge's user: KELVIN_OPERATORS). Submitting with -w or
-x to a Kelvin partition is refused with a message. Users may still cancel
their jobs.
--]]

-- Partitions whose jobs Kelvin places ({} = every partition).
local KELVIN_PARTITIONS = { @PARTITIONS@ }
-- The partition a job without -p/--partition goes to (for the test above).
local DEFAULT_PARTITION = "@DEFAULT_PARTITION@"
-- uids allowed to hold, release and re-target Kelvin's jobs.
local KELVIN_OPERATORS = { @OPERATORS@ }
-- The bridge's UDP wake-up (an IP address, so no name lookup ever runs here; "" = none):
-- one datagram per Kelvin job submitted, so the bridge places it at once instead of at its
-- next poll. UDP never waits for the receiver; without lua-socket nothing is sent.
local WAKE_HOST = "@WAKE_HOST@"
local WAKE_PORT = @WAKE_PORT@

local MARKER = "kelvin"
local NO_VAL = 4294967294
-- "Access/permission denied" where this Slurm's Lua knows the code, else a generic error
local DENIED = slurm.ESLURM_ACCESS_DENIED or slurm.ERROR

local function listed(set, value)
  for _, v in ipairs(set) do
    if v == value then return true end
  end
  return false
end

local function kelvin_partition(partition)
  if #KELVIN_PARTITIONS == 0 then return true end
  if partition == nil or partition == "" then partition = DEFAULT_PARTITION end
  -- a job may name several partitions: Kelvin's if any is
  for p in string.gmatch(partition, "[^,]+") do
    if listed(KELVIN_PARTITIONS, p) then return true end
  end
  return false
end

local wake = nil
if WAKE_HOST ~= "" then
  local ok, socket = pcall(require, "socket")
  if ok then
    local udp = socket.udp()
    if udp then
      udp:settimeout(0)
      wake = udp
    end
  end
end

local function wake_bridge()
  if wake ~= nil then
    pcall(wake.sendto, wake, "kelvin-wake", WAKE_HOST, WAKE_PORT)
  end
end

local function is_kelvin(job_rec)
  local c = job_rec.admin_comment
  return c ~= nil and string.sub(c, 1, #MARKER) == MARKER
end

local function set(v)
  return v ~= nil and v ~= NO_VAL and v ~= ""
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  if not kelvin_partition(job_desc.partition) then
    return slurm.SUCCESS
  end
  if (set(job_desc.req_nodes) or set(job_desc.exc_nodes))
      and not listed(KELVIN_OPERATORS, submit_uid) then
    slurm.log_user("Kelvin places the jobs of this partition: submit without -w/--nodelist " ..
                   "and -x/--exclude, or to another partition")
    return slurm.ERROR
  end
  job_desc.priority = 0
  job_desc.admin_comment = MARKER
  wake_bridge()
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  if not is_kelvin(job_rec) or listed(KELVIN_OPERATORS, modify_uid) then
    return slurm.SUCCESS
  end
  local what = nil
  if set(job_desc.priority) then what = "hold or release" end
  if set(job_desc.req_nodes) then what = "change the node list of" end
  if set(job_desc.exc_nodes) then what = "exclude nodes of" end
  if set(job_desc.min_nodes) or set(job_desc.max_nodes) then what = "resize" end
  if set(job_desc.partition) then what = "move" end
  if job_desc.admin_comment ~= nil then what = "re-mark" end
  if what ~= nil then
    -- (22.05 discards user messages from job_modify: the user sees "Access/permission denied")
    slurm.log_info("kelvin: refused uid %d: %s job %u", modify_uid, what, job_rec.job_id)
    return DENIED
  end
  return slurm.SUCCESS
end

return slurm.SUCCESS
