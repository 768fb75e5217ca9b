// A thin RAII layer over the SQLite C API: a connection and prepared statements whose errors
// come back as absl::Status (INTERNAL with SQLite's message; ALREADY_EXISTS for a constraint
// violation).
//
// Threading: a SqliteDb and its statements belong to one thread at a time; callers serialize.
#ifndef TRAINYARD_SERVER_SQLITE_H_
#define TRAINYARD_SERVER_SQLITE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct sqlite3;
struct sqlite3_stmt;

namespace trainyard::server {

class SqliteStatement {
 public:
  SqliteStatement(sqlite3* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  ~SqliteStatement();
  SqliteStatement(const SqliteStatement&) = delete;
  SqliteStatement& operator=(const SqliteStatement&) = delete;

  // Parameters are numbered from 1, as in SQLite.
  SqliteStatement& Bind(int index, int64_t value);
  SqliteStatement& Bind(int index, double value);
  SqliteStatement& Bind(int index, std::string_view text);
  SqliteStatement& BindBlob(int index, std::string_view bytes);
  SqliteStatement& BindNull(int index);
  SqliteStatement& Bind(int index, std::optional<int64_t> value);

  // True when a row is available, false when done. A bind error is reported here.
  [[nodiscard]] absl::StatusOr<bool> Step();
  // Runs a statement that returns no rows.
  [[nodiscard]] absl::Status Run();
  // Clears bindings and rewinds, for reuse.
  void Reset();

  // Columns are numbered from 0, as in SQLite.
  int64_t Int(int column) const;
  double Double(int column) const;
  std::string Text(int column) const;
  std::string Blob(int column) const;
  bool IsNull(int column) const;
  std::optional<int64_t> OptionalInt(int column) const;

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_;
  int bind_error_ = 0;
};

class SqliteDb {
 public:
  // Opens (creating) the database file. INTERNAL when it cannot.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SqliteDb>> Open(const std::string& path);
  ~SqliteDb();
  SqliteDb(const SqliteDb&) = delete;
  SqliteDb& operator=(const SqliteDb&) = delete;

  // Runs one or more statements that return no rows.
  [[nodiscard]] absl::Status Exec(std::string_view sql);
  [[nodiscard]] absl::StatusOr<std::unique_ptr<SqliteStatement>> Prepare(std::string_view sql);
  int64_t LastInsertRowId() const;

 private:
  explicit SqliteDb(sqlite3* db) : db_(db) {}
  sqlite3* db_;
};

// BEGIN IMMEDIATE on construction; ROLLBACK on destruction unless Commit() succeeded.
class SqliteTransaction {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SqliteTransaction>> Begin(SqliteDb& db);
  ~SqliteTransaction();
  [[nodiscard]] absl::Status Commit();

 private:
  explicit SqliteTransaction(SqliteDb& db) : db_(db) {}
  SqliteDb& db_;
  bool done_ = false;
};

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_SQLITE_H_
