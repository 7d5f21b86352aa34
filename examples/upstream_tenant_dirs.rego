# Example policy: each subject confined to its own directory of one *shared* filesystem server
# (@modelcontextprotocol/server-filesystem), e.g.
#
#   [[upstream_mcp]]
#   name = "files"
#   tenancy = "shared"
#   command = "node"
#   args = [".../server-filesystem/dist/index.js", "/srv/tenants"]
#
#   codemode serve --http ... --rego-policy examples/upstream_tenant_dirs.rego \
#       --rego-decision data.codemode.tenant_dirs.allow
#
# (Under the default tenancy, per_subject with args = [..., "{subject_dir}"], each subject has a
# server of its own that can reach nothing but its own directory, and this policy is not needed.)
#
# The trap: the server normalises a path *after* the policy has seen it, so a check on the raw
# string such as startswith(path, "/srv/tenants/bob/") lets "/srv/tenants/bob/../alice/diary.txt"
# through. This policy never normalises; it accepts only paths that are already canonical, so
# what it checked is exactly what the server opens:
#   - absolute, under the caller's own directory <root>/<subject key> (the key is what the host
#     derives: the first 32 hex digits of the SHA-256 of the subject id; lower-case hex, so no
#     case or Unicode variant of another tenant's directory exists);
#   - no empty, "." or ".." segment (so no "//", no "/./", no "/../"), no trailing "/";
#   - only the characters A-Z a-z 0-9 . _ - and space between the slashes: no "\" (a separator
#     elsewhere), no "~" (the server expands "~/"), no "%", no control characters, nothing
#     non-ASCII (the server tries Unicode-equivalent spellings of new files' names).
# What no policy can see: symbolic links. The server resolves them and checks the target against
# its own root (/srv/tenants), not against a tenant's directory; it has no tool that creates one,
# so keep the tenants' directories free of links you did not put there.
package codemode.tenant_dirs

import rego.v1

# The filesystem server's root: the one directory given to it.
root := "/srv/tenants"

# The upstream's name in the configuration: its capability ids are mcp:<name>:<tool>.
upstream := "files"

default allow := false

# The server's tools and their arguments that name a path (read_multiple_files: a list, below).
path_arguments := {
	"create_directory": ["path"],
	"directory_tree": ["path"],
	"edit_file": ["path"],
	"get_file_info": ["path"],
	"list_allowed_directories": [],
	"list_directory": ["path"],
	"list_directory_with_sizes": ["path"],
	"move_file": ["source", "destination"],
	"read_file": ["path"],
	"read_media_file": ["path"],
	"read_multiple_files": [],
	"read_text_file": ["path"],
	"search_files": ["path"],
	"write_file": ["path"],
}

prefix := concat("", ["mcp:", upstream, ":"])

# Capabilities of other packs or upstreams are not this policy's business.
allow if not startswith(input.capability.id, prefix)

allow if {
	tool := substring(input.capability.id, count(prefix), -1)
	names := path_arguments[tool]
	every name in names {
		own(input.arguments[name])
	}
	every p in object.get(input.arguments, "paths", []) {
		tool == "read_multiple_files"
		own(p)
	}
}

own_dir := concat("/", [root, substring(crypto.sha256(input.subject.id), 0, 32)])

own(p) if {
	canonical(p)
	p == own_dir
}

own(p) if {
	canonical(p)
	startswith(p, concat("", [own_dir, "/"]))
}

canonical(p) if {
	is_string(p)
	regex.match(`^(/[A-Za-z0-9._ -]+)+$`, p)
	not dot_segment(p)
}

# (Written as a helper: regopy 1.5.2 evaluates `not` inside an `every` body as true.)
dot_segment(p) if {
	some segment in split(p, "/")
	segment in {".", ".."}
}
