package admin

import _ "embed"

// openAPIDocument describes the admin REST; served at /admin/v1/openapi.json.
//
//go:embed openapi.json
var openAPIDocument []byte
