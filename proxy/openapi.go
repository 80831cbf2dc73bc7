package proxy

// openAPIDocument describes the admin REST (served at /admin/v1/openapi.json).
var openAPIDocument = []byte(`{}`)
